#!/usr/bin/python3
"""Data packed by ddp-pack, on two real workers: record shards of an image
folder's files, an image folder read through its manifest, and shards of
float32 tensors each train step for step with the same loss as the data
they were made from (the image folder, the tensors file), every sample once
per epoch.

Bad data: an image damaged in place, one truncated and one deleted after
the manifest was made fail the job naming the file; with skipBadSamples the
job trains the same number of steps, each bad sample replaced, and its
status counts the replacements and names the files. A shard that changed
since it was packed is refused when the job is submitted, naming it; an
image folder changed after the job was accepted fails the job."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import grpc

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "chaos"))
import coverage  # noqa: E402
from cluster import Cluster, step_losses  # noqa: E402
from harness import BIN  # noqa: E402
from image_folder_job_test import TRAIN, TEST, as_tensors, idx, job, write_folder  # noqa: E402

C = "ddp.v1.Coordinator/"
AUGMENT = [{"kind": "RandomResizedCrop", "size": [24], "scale": [0.5, 1.0]},
           {"kind": "RandomHorizontalFlip"}]


def pack(*args):
    out = subprocess.run([os.path.join(BIN, "ddp-pack")] + list(args), capture_output=True,
                         text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError("ddp-pack %s: %s" % (" ".join(args), out.stderr))
    return out.stdout


class ShardsJobTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ddp-shardsjob-")
        d = cls.dir
        cls.train, cls.test = os.path.join(d, "train"), os.path.join(d, "test")
        as_tensors(write_folder(cls.train, idx("train-images-idx3-ubyte.gz", TRAIN, (28, 28)),
                                idx("train-labels-idx1-ubyte.gz", TRAIN, ())),
                   os.path.join(d, "train.pt"))
        as_tensors(write_folder(cls.test, idx("t10k-images-idx3-ubyte.gz", TEST, (28, 28)),
                                idx("t10k-labels-idx1-ubyte.gz", TEST, ())),
                   os.path.join(d, "test.pt"))
        # Small shards: the samples span several files.
        pack("images", cls.train, os.path.join(d, "train-shards"), "--shard_mb=0.02")
        pack("images", cls.test, os.path.join(d, "test-shards"))
        pack("tensors", os.path.join(d, "train.pt"), os.path.join(d, "train-tensors"))
        # Folders whose parents do not exist yet are made, parents too.
        pack("tensors", os.path.join(d, "test.pt"), os.path.join(d, "new", "test-tensors"))
        pack("manifest", cls.train, os.path.join(d, "train.manifest"))
        pack("manifest", cls.test, os.path.join(d, "test.manifest"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def cluster(self):
        cluster = Cluster()
        self.addCleanup(cluster.stop)
        for i in range(2):
            cluster.start_worker(i, extra=[
                "--index_log=" + os.path.join(cluster.dir, "w%d.idx.jsonl" % i),
                "--metrics_file=" + os.path.join(cluster.dir, "w%d.steps.jsonl" % i)])
        return cluster

    def run_job(self, cluster, spec):
        cluster.client.call(C + "SubmitJob", '{"spec": %s}' % json.dumps(spec))
        get = '{"job_id": "%s"}' % spec["name"]
        cluster.wait_for(lambda: cluster.client.call(C + "GetStatus", get)["state"] in
                         ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"), 300, spec["name"] + " to end")
        return cluster.client.call(C + "GetStatus", get)

    def losses(self, cluster, name):
        return step_losses(cluster.dir, coverage.read_lines(
            os.path.join(cluster.dir, "*.idx.jsonl")), name)

    def test_packed_data_trains_as_what_it_was_made_from(self):
        d = self.dir
        specs = [
            job("tensors", {"kind": "tensors", "path": os.path.join(d, "train.pt"),
                            "testPath": os.path.join(d, "test.pt")}),
            job("image-shards", {"kind": "shards", "path": os.path.join(d, "train-shards"),
                                 "testPath": os.path.join(d, "test-shards")}),
            job("manifest", {"kind": "image-folder", "path": self.train, "testPath": self.test,
                             "manifest": os.path.join(d, "train.manifest"),
                             "testManifest": os.path.join(d, "test.manifest")}),
            job("tensor-shards", {"kind": "shards", "path": os.path.join(d, "train-tensors"),
                                  "testPath": os.path.join(d, "new", "test-tensors")}),
            job("folder-augmented", {"kind": "image-folder", "path": self.train,
                                     "transforms": AUGMENT}, evaluate=False),
            job("shards-augmented", {"kind": "shards", "path": os.path.join(d, "train-shards"),
                                     "transforms": AUGMENT, "loaderThreads": 3},
                evaluate=False),
        ]
        cluster = self.cluster()
        finals = {}
        for spec in specs:
            finals[spec["name"]] = self.run_job(cluster, spec)
            self.assertEqual(finals[spec["name"]]["state"], "JOB_STATE_SUCCEEDED",
                             finals[spec["name"]].get("message"))
        want = self.losses(cluster, "tensors")
        self.assertEqual(len(want), 2 * 2 * (TRAIN // 64))
        lines = coverage.read_lines(os.path.join(cluster.dir, "*.idx.jsonl"))
        for name in ("image-shards", "manifest", "tensor-shards"):
            self.assertEqual(self.losses(cluster, name), want, name)
            self.assertEqual(finals[name]["test_accuracy"], finals["tensors"]["test_accuracy"])
            coverage.check([l for l in lines if l["job"] == name], TRAIN, 2)
        augmented = self.losses(cluster, "shards-augmented")
        self.assertEqual(augmented, self.losses(cluster, "folder-augmented"))
        self.assertNotEqual(augmented, want)

    def damaged_copy(self):
        """A copy of the training folder and its manifest, then three of its
        images damaged: bytes flipped in place, truncated, deleted."""
        root = tempfile.mkdtemp(prefix="ddp-damaged-")
        self.addCleanup(shutil.rmtree, root, True)
        folder = os.path.join(root, "train")
        shutil.copytree(self.train, folder)
        manifest = os.path.join(root, "train.manifest")
        pack("manifest", folder, manifest)
        names = sorted(os.listdir(os.path.join(folder, "c3")))
        flipped, truncated, deleted = (os.path.join(folder, "c3", n) for n in names[1:4])
        with open(flipped, "r+b") as f:
            f.seek(40)
            byte = f.read(1)
            f.seek(40)
            f.write(bytes([byte[0] ^ 0xff]))
        with open(truncated, "r+b") as f:
            f.truncate(30)
        os.remove(deleted)
        return folder, manifest, (flipped, truncated, deleted)

    def test_bad_images_fail_the_job_or_are_skipped_and_counted(self):
        folder, manifest, bad = self.damaged_copy()
        data = {"kind": "image-folder", "path": folder, "manifest": manifest}
        cluster = self.cluster()
        # The check at submission reads a few samples spread over the data:
        # it may meet a bad one first.
        try:
            failed = self.run_job(cluster, job("strict", data, evaluate=False))
            self.assertEqual(failed["state"], "JOB_STATE_FAILED")
            message = failed["message"]
        except grpc.RpcError as e:
            self.assertEqual(e.code(), grpc.StatusCode.INVALID_ARGUMENT)
            message = e.details()
        self.assertTrue(any(b in message for b in bad), message)
        skipping = self.run_job(cluster, job("skipping", dict(data, skipBadSamples=True),
                                             evaluate=False))
        self.assertEqual(skipping["state"], "JOB_STATE_SUCCEEDED", skipping.get("message"))
        # The same steps as a clean run: every rank trained full batches.
        self.assertEqual(len(self.losses(cluster, "skipping")), 2 * 2 * (TRAIN // 64))
        # Each bad image is met twice (two epochs), once on some rank; a
        # re-formation (a busy machine's missed heartbeat) may replay the
        # step in flight, and with it a replacement.
        skipped = int(skipping["samples_skipped"])
        causes = [c["cause"] for c in skipping.get("generation_changes", [])]
        if causes == ["CHANGE_CAUSE_START"]:
            self.assertEqual(skipped, 2 * len(bad))
        else:
            self.assertGreaterEqual(skipped, 2 * len(bad), causes)
        named = "\n".join(skipping["bad_samples"])
        self.assertEqual(len(skipping["bad_samples"]), len(bad), named)
        for path in bad:
            self.assertIn(path, named)
        self.assertIn("CRC-32", named)
        self.assertIn("vanished", named)

    def test_an_image_of_another_format_is_refused_or_skipped_in_its_place(self):
        """A .bmp torchvision would read and this loader can't: refused at
        submission, naming it and what to set; with skipBadSamples replaced
        in its place (every other image keeps its torchvision index)."""
        from PIL import Image
        folder = os.path.join(self.dir, "with-bmp")
        shutil.copytree(self.train, folder)
        bmp = os.path.join(folder, sorted(os.listdir(folder))[0], "photo.bmp")
        Image.new("L", (28, 28)).save(bmp)
        data = {"kind": "image-folder", "path": folder}
        cluster = self.cluster()
        with self.assertRaises(grpc.RpcError) as refused:
            self.run_job(cluster, job("bmp-strict", data, evaluate=False))
        self.assertEqual(refused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("photo.bmp", refused.exception.details())
        self.assertIn("dataset.skipBadSamples", refused.exception.details())
        skipping = self.run_job(cluster, job("bmp-skipping", dict(data, skipBadSamples=True),
                                             evaluate=False))
        self.assertEqual(skipping["state"], "JOB_STATE_SUCCEEDED", skipping.get("message"))
        self.assertGreaterEqual(int(skipping["samples_skipped"]), 2)  # once an epoch
        self.assertIn("photo.bmp", "\n".join(skipping["bad_samples"]))

    def test_a_folder_changed_after_submission_fails_the_job(self):
        """A folder without a manifest is pinned by its listing (each image's
        name, size and label): an image resized after the job was accepted
        fails the job when the workers load it, saying so."""
        root = tempfile.mkdtemp(prefix="ddp-changed-")
        self.addCleanup(shutil.rmtree, root, True)
        folder = os.path.join(root, "train")
        shutil.copytree(self.train, folder)
        cluster = Cluster()
        self.addCleanup(cluster.stop)
        spec = job("changed-folder", {"kind": "image-folder", "path": folder}, evaluate=False)
        cluster.client.call(C + "SubmitJob", '{"spec": %s}' % json.dumps(spec))
        with open(os.path.join(folder, "c5", sorted(os.listdir(os.path.join(folder, "c5")))[0]),
                  "ab") as f:
            f.write(b"\0")
        for i in range(2):
            cluster.start_worker(i)
        get = '{"job_id": "changed-folder"}'
        cluster.wait_for(lambda: cluster.client.call(C + "GetStatus", get)["state"] ==
                         "JOB_STATE_FAILED", 120, "the job to fail")
        message = cluster.client.call(C + "GetStatus", get)["message"]
        self.assertIn(folder, message)
        self.assertIn("changed since the job was checked", message)

    def test_an_undecodable_image_is_refused_at_packing_naming_it(self):
        folder = os.path.join(self.dir, "with-bad")
        shutil.copytree(self.train, folder)
        cls = sorted(os.listdir(folder))[0]
        bad = os.path.join(folder, cls, "zz-bad.png")
        with open(bad, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)  # a PNG signature, then nothing
        out = subprocess.run([os.path.join(BIN, "ddp-pack"), "images", folder,
                              os.path.join(self.dir, "bad-shards")], capture_output=True,
                             text=True, timeout=120)
        self.assertNotEqual(out.returncode, 0, out.stderr)
        self.assertIn("zz-bad.png", out.stderr)
        self.assertIn("--keep_undecodable", out.stderr)
        # Kept on request, and named by the file it came from when read.
        pack("images", folder, os.path.join(self.dir, "kept-shards"), "--keep_undecodable")
        shown = pack("show", os.path.join(self.dir, "kept-shards", "index.ddp-pack"))
        self.assertIn("samples", shown)

    def test_a_changed_shard_is_refused_naming_it(self):
        shards = os.path.join(tempfile.mkdtemp(prefix="ddp-changed-"), "shards")
        self.addCleanup(shutil.rmtree, os.path.dirname(shards), True)
        shutil.copytree(os.path.join(self.dir, "train-tensors"), shards)
        with open(os.path.join(shards, "shard-00000.ddp-rec"), "ab") as f:
            f.write(b"\0" * 16)
        cluster = Cluster()
        self.addCleanup(cluster.stop)
        with self.assertRaises(grpc.RpcError) as e:
            cluster.client.call(C + "SubmitJob", '{"spec": %s}' % json.dumps(
                job("changed", {"kind": "shards", "path": shards})))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("shard-00000.ddp-rec", e.exception.details())
        self.assertIn("changed since", e.exception.details())


if __name__ == "__main__":
    unittest.main(verbosity=2)
