#!/usr/bin/python3
"""The coordinator runs no user code and opens no user file: a submitted job's
model and data are checked by ddp-validate, a helper process that runs as an
unprivileged user with limits and a deadline, never on a gRPC thread. Paths
must lie under the operator's roots and be regular files.

Each finding of issue 8's item 2, over real gRPC between real processes: a
model whose forward reads or writes a root-only file, a forward that never
returns, a FIFO, /dev/zero, paths outside the roots, an output that exists,
too many submissions at once, SIGTERM during a check, a hung model in --job."""
import gzip
import itertools
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
from cluster import ROOT_FLAGS, Cluster, children_of, synthetic_job  # noqa: E402
from harness import BIN, wait_for, wait_port_file  # noqa: E402
from grpc_reflect import ReflectionClient  # noqa: E402

AS_ROOT = os.geteuid() == 0
DAEMON_UID = pwd.getpwnam("daemon").pw_uid


class Reader(nn.Module):
    """Puts the bytes of `path` where an error message quotes them: the shape
    of its output."""

    def __init__(self, path: str, size: int):
        super().__init__()
        self.fc = nn.Linear(784, 10)
        self.path = path
        self.size = size

    def forward(self, x):
        secret = torch.from_file(self.path, shared=False, size=self.size, dtype=torch.uint8)
        shape = [2]
        for i in range(self.size):
            shape.append(int(secret[i]))
        return torch.zeros(shape)


class Writer(nn.Module):
    """Maps `path` shared and overwrites it."""

    def __init__(self, path: str, size: int):
        super().__init__()
        self.fc = nn.Linear(784, 10)
        self.path = path
        self.size = size

    def forward(self, x):
        target = torch.from_file(self.path, shared=True, size=self.size, dtype=torch.uint8)
        target.fill_(65)
        # Used, or TorchScript drops the whole thing as dead code.
        return self.fc(x.flatten(1)) + target[0].float() * 0.0


class Forever(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        # The count is used, or TorchScript drops the loop as dead code.
        n = 0
        while bool(x.sum() > -1.0):
            n += 1
        return self.fc(x.flatten(1)) + float(n)


class Raises(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        if bool(x.sum() >= 0):
            raise ValueError("the model refuses zeros")
        return self.fc(x.flatten(1))


class Shaped(nn.Module):
    """Returns a shape made of bytes (here fixed: 'SEC'), as a model that
    read a file would, for the refusal to echo."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        return torch.zeros([x.size(0), 83, 69, 67]) + self.fc(x.flatten(1)).sum()


class WrongBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        return torch.zeros([83, 69]) + self.fc(x.flatten(1)).sum()


class LargeBatchOnly(nn.Module):
    """Behaves below 100 samples, as at the training batch; not at the
    evaluation batch of 100."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        if x.size(0) >= 100:
            return self.fc(x.flatten(1))[:1]
        return self.fc(x.flatten(1))


class Good(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        return self.fc(x.flatten(1))


def make_folder():
    """A folder the helper's user can read (mkdtemp makes it 0700)."""
    folder = tempfile.mkdtemp(prefix="ddp-validate-")
    os.chmod(folder, 0o755)
    return folder


def save(folder, name, module):
    path = os.path.join(folder, name + ".pt")
    torch.jit.script(module).save(path)
    os.chmod(path, 0o644)
    return path


def helper_pids(parent):
    """ddp-validate processes the coordinator started."""
    return children_of(parent, "ddp-validate")


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


def write_crafted_data(folder):
    """Data files that claim more than they hold: an expanded view of one
    element as 2^56 samples, a label of 2^40, and an idx folder whose image
    header's dimensions multiply past 2^64. (Python pickles 10^12 in six
    bytes, which LibTorch's unpickler refuses outright; 2^56 takes eight.)"""
    paths = {"huge": os.path.join(folder, "huge.pt"), "label": os.path.join(folder, "label.pt"),
             "idx": os.path.join(folder, "idx")}
    n = 2 ** 56
    torch.save((torch.ones(1, 1).expand(n, 1), torch.zeros(1, dtype=torch.long).expand(n)),
               paths["huge"])
    torch.save((torch.zeros(3, 784), torch.tensor([0, 1, 2 ** 40])), paths["label"])
    os.mkdir(paths["idx"])
    header = bytes([0, 0, 8, 4]) + b"\xff\xff\xff\xff" * 3 + (16).to_bytes(4, "big")
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                 "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        with gzip.open(os.path.join(paths["idx"], name), "wb") as f:
            f.write(header + b"\0" * 64)
        os.chmod(os.path.join(paths["idx"], name), 0o644)
    os.chmod(paths["idx"], 0o755)
    for key in ("huge", "label"):
        os.chmod(paths[key], 0o644)
    return paths


def job(name, model_path=None, **overrides):
    model = {"kind": "torchscript", "path": model_path} if model_path else {"kind": "mlp"}
    return synthetic_job(name, 2, model=model, **overrides)


class Submitter:
    def __init__(self, cluster):
        self.client = cluster.client
        self.call, _, _ = cluster.client.stub("ddp.v1.Coordinator/SubmitJob")

    def request(self, spec):
        return self.client.message("ddp.v1.SubmitJobRequest", {"spec": spec})

    def now(self, spec, timeout=60):
        return self.call(self.request(spec), timeout=timeout)

    def later(self, spec, timeout=120):
        return self.call.future(self.request(spec), timeout=timeout)


class SandboxTest(unittest.TestCase):
    """One coordinator (checks as nobody, 4 s deadline, two checks at a time
    and one waiting) and two workers."""

    TIMEOUT_S = 4

    @classmethod
    def setUpClass(cls):
        cls.dir = make_folder()
        cls.secret_bytes = b"TOPSECRET-" + os.urandom(6).hex().encode()
        cls.secret = os.path.join(cls.dir, "secret")
        with open(cls.secret, "wb") as f:
            f.write(cls.secret_bytes)
        os.chmod(cls.secret, 0o600)
        cls.readonly_bytes = b"read-only for the helper's user"
        cls.readonly = os.path.join(cls.dir, "readonly")
        with open(cls.readonly, "wb") as f:
            f.write(cls.readonly_bytes)
        os.chmod(cls.readonly, 0o644)
        cls.models = {
            "reader": save(cls.dir, "reader", Reader(cls.secret, len(cls.secret_bytes))),
            "writer": save(cls.dir, "writer", Writer(cls.readonly, len(cls.readonly_bytes))),
            "forever": save(cls.dir, "forever", Forever()),
            "raises": save(cls.dir, "raises", Raises()),
            "good": save(cls.dir, "good", Good()),
            "shaped": save(cls.dir, "shaped", Shaped()),
            "wrong_batch": save(cls.dir, "wrong_batch", WrongBatch()),
            "large_batch_only": save(cls.dir, "large_batch_only", LargeBatchOnly()),
        }
        cls.fifo = os.path.join(cls.dir, "fifo")
        os.mkfifo(cls.fifo)
        cls.crafted = write_crafted_data(cls.dir)
        cls.zero_link = os.path.join(cls.dir, "zero")
        os.symlink("/dev/zero", cls.zero_link)
        cls.cluster = Cluster(heartbeat_timeout="2s", extra_flags=[
            "--validate_user=nobody", "--validate_timeout=%ds" % cls.TIMEOUT_S,
            "--validate_concurrency=2", "--validate_queue=1",
            "--data_root=" + cls.dir, "--output_root=" + cls.dir])
        cls.cluster.start_worker(0)
        cls.cluster.start_worker(1)
        wait_for(lambda: cls.cluster.status().get("attached_workers") == 2, 30, "two workers")
        cls.submit = Submitter(cls.cluster)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def refused(self, spec, code=grpc.StatusCode.INVALID_ARGUMENT, *words):
        before = self.cluster.status()
        with self.assertRaises(grpc.RpcError) as e:
            self.submit.now(spec)
        self.assertEqual(e.exception.code(), code, e.exception.details())
        for word in words:
            self.assertIn(word, e.exception.details())
        after = self.cluster.status()
        self.assertEqual((after["job_id"], after["state"]), (before["job_id"], before["state"]))
        return e.exception.details()

    def assert_no_helper_left(self):
        wait_for(lambda: not helper_pids(self.cluster.coordinator.pid), 5,
                 "the helper processes to be gone")

    @unittest.skipUnless(AS_ROOT, "the helper changes user only when the coordinator is root")
    def test_1_model_cannot_read_a_root_only_file(self):
        message = self.refused(job("reader", self.models["reader"]),
                               grpc.StatusCode.INVALID_ARGUMENT, "model.path", "forward fails")
        self.assertNotIn(self.secret_bytes.decode(), message)
        self.assertNotIn(", ".join(str(b) for b in self.secret_bytes[:4]), message)
        with open(self.secret, "rb") as f:
            self.assertEqual(f.read(), self.secret_bytes)

    @unittest.skipUnless(AS_ROOT, "the helper changes user only when the coordinator is root")
    def test_2_model_cannot_write_a_file(self):
        before = os.stat(self.readonly)
        self.refused(job("writer", self.models["writer"]), grpc.StatusCode.INVALID_ARGUMENT,
                     "model.path", "forward fails")
        with open(self.readonly, "rb") as f:
            self.assertEqual(f.read(), self.readonly_bytes)
        self.assertEqual(os.stat(self.readonly).st_mtime_ns, before.st_mtime_ns)

    def test_3_interpreter_error_keeps_its_cause(self):
        message = self.refused(job("raises", self.models["raises"]),
                               grpc.StatusCode.INVALID_ARGUMENT,
                               "model.path", "ValueError: the model refuses zeros")
        self.assertNotIn("TorchScript interpreter", message)

    def test_3b_refusals_echo_no_computed_shape(self):
        message = self.refused(job("shaped", self.models["shaped"]),
                               grpc.StatusCode.INVALID_ARGUMENT, "model.path",
                               "a tensor of 4 dimensions")
        for leaked in ("83", "69", "67"):
            self.assertNotIn(leaked, message)
        message = self.refused(job("wrong-batch", self.models["wrong_batch"]),
                               grpc.StatusCode.INVALID_ARGUMENT, "model.path",
                               "a different number of samples", "[32, C]")
        for leaked in ("83", "69"):
            self.assertNotIn(leaked, message)
        # The evaluation's batch is checked too, not only training's.
        self.refused(job("eval-batch", self.models["large_batch_only"], evalBatchSize=100),
                     grpc.StatusCode.INVALID_ARGUMENT, "model.path",
                     "a different number of samples", "[100, C]")

    def test_4_fifo_refused_at_once(self):
        start = time.time()
        self.refused(job("fifo", dataset={"kind": "tensors", "path": self.fifo}),
                     grpc.StatusCode.INVALID_ARGUMENT, "dataset.path", "a FIFO")
        self.assertLess(time.time() - start, 2)
        self.assert_no_helper_left()

    def test_5_dev_zero_refused_and_memory_flat(self):
        before = rss_kb(self.cluster.coordinator.pid)
        self.refused(job("zero", dataset={"kind": "tensors", "path": "/dev/zero"}),
                     grpc.StatusCode.INVALID_ARGUMENT, "dataset.path", "--data_root")
        self.refused(job("zero", dataset={"kind": "tensors", "path": self.zero_link}),
                     grpc.StatusCode.INVALID_ARGUMENT, "dataset.path", '"/dev/zero"',
                     "not under")
        self.assertLess(rss_kb(self.cluster.coordinator.pid) - before, 10 * 1024)

    def test_5b_crafted_data_files_refused_before_allocating(self):
        before = rss_kb(self.cluster.coordinator.pid)
        self.refused(job("huge", dataset={"kind": "tensors", "path": self.crafted["huge"]}),
                     grpc.StatusCode.INVALID_ARGUMENT, "dataset.path",
                     "72057594037927936 elements in x", "limit is 4294967296")
        self.refused(job("label", dataset={"kind": "tensors", "path": self.crafted["label"]}),
                     grpc.StatusCode.INVALID_ARGUMENT, "dataset.path",
                     "labels from 0 to 1099511627776")
        self.refused(job("idx", dataset={"kind": "fashion-mnist", "path": self.crafted["idx"]}),
                     grpc.StatusCode.INVALID_ARGUMENT, "dataset.path",
                     "declares shape [4294967295, 4294967295", "limit of 8589934592 bytes")
        self.refused(job("folder", dataset={"kind": "tensors", "path": self.crafted["idx"]}),
                     grpc.StatusCode.INVALID_ARGUMENT, "dataset.path", "folder")
        self.assertLess(rss_kb(self.cluster.coordinator.pid) - before, 10 * 1024)
        self.assert_no_helper_left()

    def test_6_paths_outside_the_roots_and_existing_outputs(self):
        self.refused(job("out", outputPath="/etc/passwd"), grpc.StatusCode.INVALID_ARGUMENT,
                     "output_path", "--output_root")
        self.refused(job("out", outputPath=os.path.join(self.dir, "..", "x.pt")),
                     grpc.StatusCode.INVALID_ARGUMENT, "output_path", '".."')
        self.refused(job("out", outputPath=self.readonly), grpc.StatusCode.INVALID_ARGUMENT,
                     "output_path", "already exists", "overwrite_output")
        self.refused(job("out", outputPath=self.dir), grpc.StatusCode.INVALID_ARGUMENT,
                     "output_path", "folder")
        self.refused(job("model", "/etc/passwd"), grpc.StatusCode.INVALID_ARGUMENT,
                     "model.path", "--data_root")
        with open(self.readonly, "rb") as f:
            self.assertEqual(f.read(), self.readonly_bytes)

    def test_7_forward_that_never_returns_while_a_job_trains(self):
        c = self.cluster
        start = time.time()
        pending = self.submit.later(job("forever", self.models["forever"]))
        wait_for(lambda: helper_pids(c.coordinator.pid), 10, "the hung check to start")
        # The other check slot takes a job, which trains meanwhile.
        self.submit.now(job("steady", epochs=1000))
        c.wait_state("JOB_STATE_RUNNING", timeout=30)
        self.assertFalse(pending.done())
        # Status reads, a status stream, health: all answer at once while the
        # check runs past the workers' heartbeat timeout (2 s).
        watch, _, _ = c.client.stub("ddp.v1.Coordinator/WatchStatus")
        stream = watch(c.client.message("ddp.v1.WatchStatusRequest", {"intervalSeconds": 0.2}),
                       timeout=30)
        updates = []

        def follow():
            try:
                for update in stream:
                    updates.append(update)
            except grpc.RpcError:
                pass  # cancelled below

        threading.Thread(target=follow, daemon=True).start()
        slowest, steps = 0, []
        while not pending.done():
            t = time.time()
            status = c.status()
            c.client.call("ddp.v1.Coordinator/ListWorkers")
            health = c.client.call("grpc.health.v1.Health/Check")
            slowest = max(slowest, time.time() - t)
            self.assertEqual(status["state"], "JOB_STATE_RUNNING", status.get("message"))
            self.assertEqual(status["attached_workers"], 2)
            self.assertEqual(health["status"], "SERVING")
            steps.append(int(status.get("global_step", 0)))
            time.sleep(0.2)
        stream.cancel()
        self.assertLess(slowest, 1.0)
        self.assertGreaterEqual(len(updates), 2)  # the stream goes on, too
        self.assertGreater(steps[-1], steps[0])  # and so does training
        with self.assertRaises(grpc.RpcError) as e:
            pending.result()
        self.assertEqual(e.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertIn("%ds" % self.TIMEOUT_S, e.exception.details())
        self.assertIn("--validate_timeout", e.exception.details())
        self.assertGreaterEqual(time.time() - start, self.TIMEOUT_S)
        self.assert_no_helper_left()
        self.assertEqual(c.status()["job_id"], "steady")
        c.client.call("ddp.v1.Coordinator/CancelJob", '{"job_id": "steady"}')
        c.wait_state("JOB_STATE_CANCELLED", timeout=30)

    def test_8_too_many_checks_at_once(self):
        c = self.cluster
        running = [self.submit.later(job("forever-%d" % i, self.models["forever"]))
                   for i in range(2)]
        seen = []

        def two_checks_running():
            # A check that ended early says why here, not as a timeout.
            for pending in running:
                if pending.done():
                    self.fail("a check ended before the other started: %s (helpers seen: %s)" %
                              (pending.exception(), seen))
            seen.append(len(helper_pids(c.coordinator.pid)))
            return seen[-1] == 2

        try:
            wait_for(two_checks_running, 10, "two checks to run")
        except AssertionError:
            runs = [(n, len(list(g))) for n, g in itertools.groupby(seen)]
            self.fail("two checks never ran at once; (helpers, polls) over time: %s" % runs)
        waiting = self.submit.later(job("forever-w", self.models["forever"]))
        time.sleep(0.3)  # for it to reach the queue
        start = time.time()
        self.refused(job("fourth", self.models["good"]), grpc.StatusCode.RESOURCE_EXHAUSTED,
                     "--validate_queue")
        self.assertLess(time.time() - start, 1.0)
        for pending in running + [waiting]:
            with self.assertRaises(grpc.RpcError) as e:
                pending.result()
            self.assertEqual(e.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assert_no_helper_left()

    def test_9_good_job_trains_and_its_output_is_never_replaced(self):
        output = os.path.join(self.dir, "trained.pt")
        self.submit.now(job("good", self.models["good"], epochs=1, maxSteps=20,
                            outputPath=output))
        done = self.cluster.wait_state(["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"], timeout=120)
        self.assertEqual(done["state"], "JOB_STATE_SUCCEEDED", done["message"])
        self.assertTrue(stat.S_ISREG(os.stat(output).st_mode))
        torch.jit.load(output)
        with self.assertRaises(grpc.RpcError) as e:
            self.submit.now(job("again", self.models["good"], outputPath=output))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("overwrite_output", e.exception.details())


class DeviceAsDataTest(unittest.TestCase):
    """With every path allowed (ddp-run's --data_root=/), a device is still no
    data file, and the coordinator never reads it."""

    def test_dev_zero_is_not_a_regular_file(self):
        c = Cluster(extra_flags=["--data_root=/"])
        try:
            submit = Submitter(c)
            before = rss_kb(c.coordinator.pid)
            for _ in range(20):
                with self.assertRaises(grpc.RpcError) as e:
                    submit.now(job("zero", dataset={"kind": "tensors", "path": "/dev/zero"}))
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn("a character device, not a regular file", e.exception.details())
            self.assertLess(rss_kb(c.coordinator.pid) - before, 10 * 1024)
            self.assertEqual(helper_pids(c.coordinator.pid), [])
        finally:
            c.stop()


class ShutdownTest(unittest.TestCase):
    def test_sigterm_during_a_check_stops_promptly(self):
        folder = make_folder()
        forever = save(folder, "forever", Forever())
        c = Cluster(extra_flags=["--validate_timeout=120s"])
        try:
            pending = Submitter(c).later(job("forever", forever))
            helpers = wait_for(lambda: helper_pids(c.coordinator.pid), 10, "the check to run")
            start = time.time()
            c.coordinator.send_signal(signal.SIGTERM)
            self.assertEqual(c.coordinator.wait(timeout=10), 0, c.log("coordinator"))
            self.assertLess(time.time() - start, 5)
            with self.assertRaises(grpc.RpcError) as e:
                pending.result()
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
            for pid in helpers:
                self.assertFalse(os.path.exists("/proc/%d" % pid), "helper %d still runs" % pid)
        finally:
            c.stop()


class StartupTest(unittest.TestCase):
    def test_hung_model_in_job_file_is_a_clear_error(self):
        folder = make_folder()
        job_file = os.path.join(folder, "job.json")
        with open(job_file, "w") as f:
            json.dump(job("forever", save(folder, "forever", Forever())), f)
        start = time.time()
        result = subprocess.run(
            [os.path.join(BIN, "ddp-coordinator"), "--listen=127.0.0.1:0", "--job=" + job_file,
             "--validate_timeout=2s"] + ROOT_FLAGS, capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 2, result.stderr)  # not an abort
        self.assertIn("--job", result.stderr)
        self.assertIn("longer than 2s", result.stderr)
        self.assertLess(time.time() - start, 30)


class UnitUserTest(unittest.TestCase):
    """As the systemd unit runs it: the coordinator as its own user (here
    daemon) holding CAP_SETUID and CAP_SETGID alone. The check still runs as
    --validate_user, so a model can't read what only the coordinator's user
    may (under the unit: /etc/ddp's keys and tokens, the state directory).
    Without the two capabilities it runs as the coordinator's user, and the
    same model reads the file: the test can tell the two apart."""

    def setUp(self):
        if not AS_ROOT or not shutil.which("setpriv"):
            self.skipTest("needs root and setpriv (util-linux) to start a coordinator as daemon")
        self.dir = make_folder()
        self.secret_bytes = b"DAEMONONLY-" + os.urandom(6).hex().encode()
        self.secret = os.path.join(self.dir, "secret")
        with open(self.secret, "wb") as f:
            f.write(self.secret_bytes)
        os.chown(self.secret, DAEMON_UID, DAEMON_UID)
        os.chmod(self.secret, 0o600)
        self.model = save(self.dir, "reader", Reader(self.secret, len(self.secret_bytes)))

    def check_as_daemon(self, caps):
        run = tempfile.mkdtemp(prefix="ddp-unit-user-")
        os.chown(run, DAEMON_UID, DAEMON_UID)
        port_file = os.path.join(run, "port")
        wrapper = ["setpriv", "--reuid=daemon", "--regid=daemon", "--clear-groups"]
        if caps:
            wrapper += ["--inh-caps=+setuid,+setgid", "--ambient-caps=+setuid,+setgid",
                        "--bounding-set=-all,+setuid,+setgid"]
        else:
            wrapper += ["--inh-caps=-all", "--bounding-set=-all"]
        with open(os.path.join(run, "coordinator.log"), "w") as log:
            coordinator = subprocess.Popen(wrapper + [
                os.path.join(os.path.abspath(BIN), "ddp-coordinator"), "--listen=127.0.0.1:0",
                "--port_file=" + port_file, "--validate_user=nobody",
                # The test, not the coordinator's user, submits: anonymously.
                "--allow_anonymous_loopback",
                "--data_root=" + self.dir, "--output_root=" + self.dir],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            port = wait_port_file(port_file, 30, "the coordinator to serve", coordinator)
            client = ReflectionClient("127.0.0.1:%s" % port)
            try:
                call, _, _ = client.stub("ddp.v1.Coordinator/SubmitJob")
                request = client.message("ddp.v1.SubmitJobRequest",
                                         {"spec": job("reader", self.model)})
                with self.assertRaises(grpc.RpcError) as e:
                    call(request, timeout=60)
            finally:
                client.close()
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT,
                             e.exception.details())
            with open(os.path.join(run, "coordinator.log")) as f:
                return e.exception.details(), f.read()
        finally:
            coordinator.send_signal(signal.SIGTERM)
            coordinator.wait(timeout=30)

    def test_with_setuid_capabilities_the_check_runs_as_validate_user(self):
        message, log = self.check_as_daemon(caps=True)
        self.assertIn("as nobody (uid", log)
        self.assertNotIn(", ".join(str(b) for b in self.secret_bytes[:4]), message)

    def test_without_them_it_runs_as_the_coordinators_user(self):
        message, log = self.check_as_daemon(caps=False)
        self.assertIn("as the coordinator's own user", log)
        # The user could read the file, but the check is confined to the
        # job's inputs (Landlock), and its refusals echo no computed shape.
        self.assertIn("Permission denied", message)
        self.assertNotIn(", ".join(str(b) for b in self.secret_bytes[:4]), message)


if __name__ == "__main__":
    unittest.main(verbosity=2)
