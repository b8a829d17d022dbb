#!/usr/bin/python3
"""A job's code runs confined on the workers (issue 20, item 1): the check at
submission can't prove what a model does at step 10,000, so each worker
confines the threads that run the job (Landlock, seccomp) to its inputs,
output and checkpoint folders.

Real training jobs, two real workers over Gloo, with TorchScript models that
pass the check (they behave in eval mode, as the check runs them) and turn
hostile once training: one overwrites a file outside the job's folders, one
reads a file the job doesn't name. Each job fails with an error that says the
confinement refused it, and the files are untouched. A good job with
checkpoints and an output trains as before. (TorchScript has no fork or
socket operator: those refusals are tested in tests/unit/confinement_test.cc
on the same confinement.)"""
import os
import shutil
import sys
import tempfile
import unittest

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
from cluster import TMP, Cluster, synthetic_job  # noqa: E402
from harness import wait_for  # noqa: E402


class TouchesAFile(nn.Module):
    """A linear model that knows a file's path and size."""

    def __init__(self, path: str, size: int):
        super().__init__()
        self.fc = nn.Linear(784, 10)
        self.path = path
        self.size = size


class WritesWhenTraining(TouchesAFile):
    """Overwrites `path` once in training mode (the check runs eval)."""

    def forward(self, x):
        out = self.fc(x.flatten(1))
        if self.training and x.size(0) > 2:
            target = torch.from_file(self.path, shared=True, size=self.size, dtype=torch.uint8)
            target.fill_(65)
            out = out + target[0].float() * 0.0
        return out


class ReadsWhenTraining(TouchesAFile):
    """Reads `path` once in training mode and mixes it into the loss."""

    def forward(self, x):
        out = self.fc(x.flatten(1))
        if self.training:
            secret = torch.from_file(self.path, shared=False, size=self.size, dtype=torch.uint8)
            out = out + secret.float().sum() * 0.0
        return out


class Good(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        return self.fc(x.flatten(1))


class ConfinementTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ddp-confinement-", dir=TMP)
        cls.victim_bytes = b"a file the job doesn't name"
        cls.victim = os.path.join(cls.dir, "victim")
        cls.secret = os.path.join(cls.dir, "secret")
        for path in (cls.victim, cls.secret):
            with open(path, "wb") as f:
                f.write(cls.victim_bytes)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def save(self, name, module):
        path = os.path.join(self.dir, name + ".pt")
        torch.jit.script(module).save(path)
        return path

    def run_job(self, name, module, **overrides):
        spec = synthetic_job(name, 2, model={"kind": "torchscript",
                                             "path": self.save(name, module)}, **overrides)
        cluster = Cluster(job=spec)
        try:
            cluster.start_worker(0)
            cluster.start_worker(1)
            status = cluster.wait_state(["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"], timeout=60)
            logs = ""
            for i in (0, 1):
                with open(os.path.join(cluster.dir, "w%d.log" % i)) as f:
                    logs += f.read()
            return status, logs
        except AssertionError:
            print("logs in", cluster.dir, file=sys.stderr)
            raise
        finally:
            cluster.stop()

    def assert_untouched(self, path):
        with open(path, "rb") as f:
            self.assertEqual(f.read(), self.victim_bytes)

    def test_a_model_that_writes_outside_its_folders_fails_the_job(self):
        status, logs = self.run_job("writer", WritesWhenTraining(self.victim,
                                                                 len(self.victim_bytes)))
        self.assertEqual(status["state"], "JOB_STATE_FAILED", status)
        self.assertIn("confinement", status["message"])
        self.assertIn("Permission denied", status["message"])
        self.assertIn("refused by the worker's confinement", logs)
        self.assert_untouched(self.victim)

    def test_a_model_that_reads_outside_its_inputs_fails_the_job(self):
        status, _ = self.run_job("reader", ReadsWhenTraining(self.secret, len(self.victim_bytes)))
        self.assertEqual(status["state"], "JOB_STATE_FAILED", status)
        self.assertIn("confinement", status["message"])
        self.assertNotIn(self.victim_bytes.decode(), status["message"])

    def test_a_good_job_writes_its_checkpoints_and_output(self):
        out = os.path.join(self.dir, "out")
        os.mkdir(out)
        status, _ = self.run_job("good", Good(), outputPath=os.path.join(out, "model.pt"),
                                 checkpoint={"dir": os.path.join(self.dir, "ckpt"),
                                             "everySteps": 16})
        self.assertEqual(status["state"], "JOB_STATE_SUCCEEDED", status)
        self.assertTrue(os.path.exists(os.path.join(out, "model.pt")))
        wait_for(lambda: os.listdir(os.path.join(self.dir, "ckpt")), 5, "a checkpoint")
        self.assertEqual(torch.jit.load(os.path.join(out, "model.pt"))(
            torch.zeros(2, 1, 28, 28)).shape, (2, 10))


class PinnedInputsTest(unittest.TestCase):
    """Item 2: what the check read is what the workers train on, and what it
    allowed is where they write. A job's files are changed after SubmitJob
    answered OK, before any worker attached: a re-pointed symbolic link
    still trains the checked file; a file rewritten in place fails the job,
    naming it; a checkpoint folder swapped for a link fails it, naming the
    folder; a link to it re-pointed writes nothing where it now leads."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ddp-pinned-", dir=TMP)
        self.addCleanup(shutil.rmtree, self.dir, True)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(256, 1, 28, 28, generator=g)
        y = torch.randint(0, 10, (256,), generator=g)
        self.good = os.path.join(self.dir, "good.pt")
        torch.save((x, y), self.good)
        # What a swap would bring in: labels no worker accepts, so a job
        # that read it would fail.
        self.swapped = os.path.join(self.dir, "swapped.pt")
        torch.save((x, y + 10 ** 6), self.swapped)
        self.link = os.path.join(self.dir, "data.pt")
        os.symlink(self.good, self.link)

    def submit_then(self, change, **overrides):
        cluster = Cluster()
        self.addCleanup(cluster.stop)
        call, _, _ = cluster.client.stub("ddp.v1.Coordinator/SubmitJob")
        spec = synthetic_job("pinned", 2, dataset={"kind": "tensors", "path": self.link},
                             **overrides)
        call(cluster.client.message("ddp.v1.SubmitJobRequest", {"spec": spec}), timeout=60)
        change()
        cluster.start_worker(0)
        cluster.start_worker(1)
        return cluster.wait_state(["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"], timeout=120)

    def test_a_link_repointed_after_the_check_still_trains_what_was_checked(self):
        def repoint():
            os.remove(self.link)
            os.symlink(self.swapped, self.link)
        status = self.submit_then(repoint)
        self.assertEqual(status["state"], "JOB_STATE_SUCCEEDED", status)

    def test_a_checkpoint_folder_swapped_for_a_link_is_refused_and_nothing_written_there(self):
        # Checked as a real folder under the output root; swapped, before
        # any worker confined the job, for a link to a folder the job must
        # not write (here another folder of the test's: anywhere else).
        ckpt = os.path.join(self.dir, "ckpt")
        os.mkdir(ckpt)
        elsewhere = os.path.join(self.dir, "elsewhere")
        os.mkdir(elsewhere)

        def swap():
            os.rmdir(ckpt)
            os.symlink(elsewhere, ckpt)
        status = self.submit_then(swap, checkpoint={"dir": ckpt, "everySteps": 4})
        self.assertEqual(status["state"], "JOB_STATE_FAILED", status)
        self.assertIn(ckpt, status["message"])
        self.assertIn("symbolic link", status["message"])
        self.assertEqual(os.listdir(elsewhere), [], "nothing written through the link")

    def test_a_link_on_the_way_to_the_checkpoint_folder_repointed_writes_nothing_there(self):
        # checkpoint.dir names a link, checked as leading to `real`; re-pointed
        # to `elsewhere` after the check. The job trains; its checkpoints,
        # written through the link, are refused (the confinement allows
        # `real` only), and nothing lands in `elsewhere`.
        real = os.path.join(self.dir, "real-ckpt")
        elsewhere = os.path.join(self.dir, "elsewhere")
        os.mkdir(real)
        os.mkdir(elsewhere)
        link = os.path.join(self.dir, "ckpt-link")
        os.symlink(real, link)

        def repoint():
            os.remove(link)
            os.symlink(elsewhere, link)
        status = self.submit_then(repoint, checkpoint={"dir": link, "everySteps": 4})
        self.assertIn(status["state"], ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"), status)
        self.assertEqual(os.listdir(elsewhere), [], "nothing written through the re-pointed link")

    def test_a_file_rewritten_after_the_check_fails_the_job_naming_it(self):
        def rewrite():
            with open(self.good, "r+b") as f:
                f.seek(-8, os.SEEK_END)
                f.write(b"\x01" * 8)
        status = self.submit_then(rewrite)
        self.assertEqual(status["state"], "JOB_STATE_FAILED", status)
        self.assertIn("dataset.path", status["message"])
        self.assertIn("rewritten since", status["message"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
