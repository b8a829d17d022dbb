#!/usr/bin/python3
"""A user's program on the installed library, from outside the tree: `cmake
--install` into a temporary prefix, examples/custom_loop configured with
find_package(ddp) against that prefix and built, then run two-way under the
installed ddp-run (loss falls, accuracy printed) and started by hand as
torchrun would (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Also what
ddp-run hands a program, and that one failing rank stops the others."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import BIN, free_port, thread_env  # noqa: E402

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../..")
BUILD = os.environ.get("DDP_BUILD_DIR", os.path.join(REPO, "build"))


def run(cmd, timeout, **kwargs):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    if done.returncode != 0:
        raise AssertionError("%s exited with %d:\n%s%s" % (
            " ".join(cmd), done.returncode, done.stdout[-3000:], done.stderr[-3000:]))
    return done.stdout


class DdpRunProgramTest(unittest.TestCase):
    def test_each_rank_gets_its_place_and_a_share_of_the_cores(self):
        out = run([os.path.join(BIN, "ddp-run"), "--nproc=3", "--threads=2", "--",
                   "sh", "-c", "echo rank=$RANK/$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE "
                   "master=$MASTER_ADDR:$MASTER_PORT omp=$OMP_NUM_THREADS"], timeout=60)
        lines = sorted(l for l in out.splitlines() if l.startswith("rank="))
        self.assertEqual(len(lines), 3, out)
        ports = set()
        for rank, line in enumerate(lines):
            m = re.match(r"rank=(\d)/3 local=(\d)/3 master=127\.0\.0\.1:(\d+) omp=2$", line)
            self.assertIsNotNone(m, line)
            self.assertEqual(int(m.group(1)), rank)
            self.assertEqual(int(m.group(2)), rank)
            ports.add(m.group(3))
        self.assertEqual(len(ports), 1)
        self.assertIn("all 3 rank(s) finished", out)

    def test_a_failing_rank_stops_the_others_and_gives_its_code(self):
        started = time.time()
        done = subprocess.run(
            [os.path.join(BIN, "ddp-run"), "--nproc=2", "--",
             "sh", "-c", 'if [ "$RANK" = 1 ]; then exit 3; fi; sleep 60'],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(done.returncode, 3, done.stdout + done.stderr)
        self.assertLess(time.time() - started, 30)
        self.assertIn("rank 1 exited with code 3", done.stderr)

    def test_job_and_program_together_refused(self):
        done = subprocess.run([os.path.join(BIN, "ddp-run"), "--job=x.json", "--", "true"],
                              capture_output=True, text=True, timeout=30)
        self.assertEqual(done.returncode, 2)
        self.assertIn("can't be given together", done.stderr)


@unittest.skipUnless(os.path.exists(os.path.join(BUILD, "CMakeCache.txt")),
                     "no build folder at " + BUILD)
class OutOfTreeExampleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ddp-example-")
        cls.prefix = os.path.join(cls.dir, "prefix")
        run(["cmake", "--install", BUILD, "--prefix", cls.prefix], timeout=300)
        build = os.path.join(cls.dir, "build")
        run(["cmake", "-S", os.path.join(REPO, "examples/custom_loop"), "-B", build, "-G", "Ninja",
             "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_PREFIX_PATH=" + cls.prefix], timeout=300)
        run(["cmake", "--build", build], timeout=900)
        cls.program = os.path.join(build, "custom_loop")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def check_trained(self, out):
        losses = [float(x) for x in re.findall(r"^epoch \d+ loss ([0-9.]+)", out, re.M)]
        self.assertGreaterEqual(len(losses), 2, out)
        self.assertLess(losses[-1], losses[0] * 0.8, out)
        accuracy = float(re.search(r"^accuracy ([0-9.]+)", out, re.M).group(1))
        self.assertGreater(accuracy, 0.8, out)
        return accuracy

    def test_installed_package_has_headers_library_and_config(self):
        for path in ("include/ddp/ddp.h", "include/ddp/version.h", "lib/cmake/ddp/ddpConfig.cmake",
                     "lib/cmake/ddp/ddpConfigVersion.cmake", "bin/ddp-run"):
            self.assertTrue(os.path.exists(os.path.join(self.prefix, path)), path)
        headers = os.listdir(os.path.join(self.prefix, "include/ddp"))
        for header in headers:
            with open(os.path.join(self.prefix, "include/ddp", header)) as f:
                text = f.read()
            self.assertNotIn("grpc", text, header)
            self.assertNotIn(".pb.h", text, header)

    def test_runs_two_way_under_the_installed_ddp_run(self):
        out = run([os.path.join(self.prefix, "bin/ddp-run"), "--nproc=2", "--", self.program,
                   "--data", os.path.join(self.dir, "data-run"), "--epochs", "20"], timeout=300)
        print("under ddp-run: accuracy %.3f" % self.check_trained(out))

    def test_runs_two_way_started_as_torchrun_starts_ranks(self):
        port = str(free_port())
        procs = [subprocess.Popen(
            [self.program, "--data", os.path.join(self.dir, "data-env"), "--epochs", "20"],
            env=thread_env(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
        outs = [p.communicate(timeout=300)[0] for p in procs]
        self.assertEqual([p.returncode for p in procs], [0, 0], "\n".join(outs))
        self.check_trained(outs[0])


if __name__ == "__main__":
    unittest.main()
