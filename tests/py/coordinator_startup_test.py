#!/usr/bin/python3
"""Starting the coordinator the way a service manager does, again and again:
a bad --job file is a clear error and exit code 2, never an abort (a crash
loop under Restart=on-failure); the same --job over the same --state-dir is
a no-op, also once the job has ended (it is not run again); another spec
under the same name is refused, naming the field that differs."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import unittest

import torch

sys.path.insert(0, os.path.dirname(__file__))
from cluster import ROOT_FLAGS, Cluster, synthetic_job  # noqa: E402
from harness import BIN  # noqa: E402


def run_coordinator(*flags, timeout=60):
    """Runs a coordinator that should exit by itself (an error at start)."""
    return subprocess.run([os.path.join(BIN, "ddp-coordinator"), "--listen=127.0.0.1:0"] +
                          ROOT_FLAGS + list(flags), capture_output=True, text=True,
                          timeout=timeout)


class BadJobFileTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ddp-startup-")

    def write_job(self, name, job):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            json.dump(job, f)
        return path

    def assert_clear_exit(self, result, *words):
        self.assertEqual(result.returncode, 2, result.stderr)  # not -6 (SIGABRT)
        for word in words:
            self.assertIn(word, result.stderr)

    def test_data_file_that_makes_libtorch_throw(self):
        data = os.path.join(self.dir, "garbage.pt")
        with open(data, "wb") as f:
            f.write(b"PK\x03\x04" + os.urandom(4096))
        job = self.write_job("job.json", synthetic_job(
            "bad-data", 1, dataset={"kind": "tensors", "path": data}))
        self.assert_clear_exit(run_coordinator("--job=" + job), "--job", "garbage.pt")

    def test_tensors_of_the_wrong_kind(self):
        data = os.path.join(self.dir, "strings.pt")
        torch.save({"not": "a tuple"}, data)
        job = self.write_job("job.json", synthetic_job(
            "wrong-kind", 1, dataset={"kind": "tensors", "path": data}))
        self.assert_clear_exit(run_coordinator("--job=" + job), "--job", "dataset")

    def test_not_json_and_unknown_field(self):
        path = os.path.join(self.dir, "broken.json")
        with open(path, "w") as f:
            f.write("{ not json")
        self.assert_clear_exit(run_coordinator("--job=" + path), "--job", "JobSpec")
        path = self.write_job("unknown.json", dict(synthetic_job("x", 1), colour="blue"))
        self.assert_clear_exit(run_coordinator("--job=" + path), "colour")

    def test_missing_file(self):
        self.assert_clear_exit(run_coordinator("--job=/nonexistent/job.json"), "/nonexistent")


class SameJobAgainTest(unittest.TestCase):
    """The unit restarts the coordinator with the flags it had: --job names
    the job the state directory already holds."""

    def test_same_job_is_a_no_op_and_another_spec_is_refused(self):
        state = tempfile.mkdtemp(prefix="ddp-state-")
        job = synthetic_job("again", 1, epochs=1, maxSteps=20)
        c = Cluster(job=job, extra_flags=["--state_dir=" + state])
        try:
            c.start_worker(0)
            done = c.wait_state("JOB_STATE_SUCCEEDED", timeout=120)
            self.assertEqual(done["generation"], "1")
        finally:
            c.stop()
        # Restarted with the same flags: the finished job is not run again.
        c = Cluster(job=job, extra_flags=["--state_dir=" + state])
        try:
            c.start_worker(0)
            status = c.wait_state("JOB_STATE_SUCCEEDED", timeout=30)
            self.assertEqual(status["generation"], "1")
            self.assertEqual(status["job_id"], "again")
        finally:
            c.stop()
        self.assertEqual(c.coordinator.returncode, 0, c.log("coordinator"))
        # Another spec under the same name: refused at start, naming the field.
        path = os.path.join(c.dir, "other.json")
        with open(path, "w") as f:
            json.dump(dict(job, batchSize=16), f)
        result = run_coordinator("--job=" + path, "--state_dir=" + state)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("already exists", result.stderr)
        self.assertIn("batch_size", result.stderr)


class UnwritableCheckpointFolderTest(unittest.TestCase):
    """A checkpoint folder that can't be made when the workers come to it
    (one under a regular file is refused at submission; here the file
    appears after): training goes on, and the status says why there are no
    checkpoints, naming the folder."""

    def test_training_goes_on_and_status_names_the_folder(self):
        base = tempfile.mkdtemp(prefix="ddp-ckpt-")
        blocker = os.path.join(base, "a-file")
        folder = os.path.join(blocker, "checkpoints")
        job = synthetic_job("no-ckpt", 2, epochs=1, maxSteps=30,
                            checkpoint={"dir": folder, "everySteps": 10})
        c = Cluster(job=job)
        open(blocker, "w").close()  # the folder can't be made any more
        try:
            c.start_worker(0)
            c.start_worker(1)
            done = c.wait_state(["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"], timeout=120)
            self.assertEqual(done["state"], "JOB_STATE_SUCCEEDED", done.get("message"))
            self.assertIn(folder, done.get("checkpoint_error", ""))
            self.assertEqual(done.get("last_checkpoint_step", "0"), "0")
        finally:
            c.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
