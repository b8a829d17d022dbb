#!/usr/bin/python3
"""Workers say what is wrong: every refusal logs the coordinator's status and
message; refusals that retrying can't cure end the worker with exit 2 at
once; a duplicate device, an unreachable coordinator, a silent TCP listener
and an HTTP server are retried, saying why (rate-limited), and never hang
the worker."""
import http.server
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from concurrent import futures

import grpc

sys.path.insert(0, os.path.dirname(__file__))
from certs import Pki  # noqa: E402
from cluster import Cluster  # noqa: E402
from harness import BIN, free_port, wait_for  # noqa: E402

# The worker's deadline for an answer to its register (WorkerAgent::Options).
REGISTER_TIMEOUT = 10


class Worker:
    """A ddp-worker process whose log the test reads."""

    def __init__(self, coordinator, name, extra=(), device="cpu:0", env=None):
        self.dir = tempfile.mkdtemp(prefix="ddp-refusal-")
        self.log_path = os.path.join(self.dir, name + ".log")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [os.path.join(BIN, "ddp-worker"), "--coordinator=" + coordinator,
                 "--device=" + device, "--host=127.0.0.1", "--name=" + name, "--threads=1"] +
                list(extra), stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        self.started = time.time()

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def wait_exit(self, timeout):
        return self.proc.wait(timeout=timeout)

    def wait_log(self, fragment, timeout):
        return wait_for(lambda: fragment in self.log(), timeout,
                        "%r in the worker's log:\n%s" % (fragment, self.log()))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("the worker did not stop on SIGTERM:\n" + self.log())
        return self.proc.returncode


class FakeCoordinator:
    """A gRPC server that answers every Attach with one status, as a
    coordinator refusing the register does (a version mismatch is
    FAILED_PRECONDITION; a malformed register INVALID_ARGUMENT)."""

    def __init__(self, code, details):
        class Handler(grpc.GenericRpcHandler):
            def service(self, call_details):
                if call_details.method != "/ddp.v1.Coordinator/Attach":
                    return None

                def attach(requests, context):
                    next(requests)  # the RegisterRequest, as bytes
                    context.abort(code, details)
                return grpc.stream_stream_rpc_method_handler(attach)

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers([Handler()])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.target = "127.0.0.1:%d" % self.port

    def stop(self):
        self.server.stop(0)


class FatalRefusalTest(unittest.TestCase):
    """Refusals that retrying can't cure: exit 2 at once, with the reason."""

    @classmethod
    def setUpClass(cls):
        cls.pki = Pki()
        cls.cluster = Cluster(extra_flags=["--tokens_file=" + cls.pki.tokens_file],
                              client_options=dict(token=cls.pki.tokens["operator"]))

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        cls.pki.remove()

    def assertExits2(self, worker, *fragments):
        try:
            code = worker.wait_exit(timeout=15)
        except subprocess.TimeoutExpired:
            worker.stop()
            self.fail("the worker kept running:\n" + worker.log())
        log = worker.log()
        self.assertEqual(code, 2, log)
        self.assertLess(time.time() - worker.started, 15)
        for f in fragments:
            self.assertIn(f, log)
        self.assertIn("retrying can't change that", log)

    def test_version_mismatch_failed_precondition(self):
        fake = FakeCoordinator(grpc.StatusCode.FAILED_PRECONDITION,
                               'worker version "0.0.9" differs from the coordinator\'s "0.1.0"; '
                               "run the same build on every machine")
        self.addCleanup(fake.stop)
        self.assertExits2(Worker(fake.target, "old"), "FAILED_PRECONDITION",
                          'worker version "0.0.9" differs')

    def test_invalid_argument(self):
        fake = FakeCoordinator(grpc.StatusCode.INVALID_ARGUMENT, "register.device: nope")
        self.addCleanup(fake.stop)
        self.assertExits2(Worker(fake.target, "bad"), "INVALID_ARGUMENT: register.device: nope")

    def test_unknown_token_unauthenticated(self):
        wrong = self.pki.write_token("wrong", "0123456789abcdef0123456789abcdef")
        self.assertExits2(Worker(self.cluster.target, "wrong", ["--token_file=" + wrong]),
                          "UNAUTHENTICATED", "unknown bearer token", "--token_file")

    def test_no_token_unauthenticated(self):
        # A folder of local tokens of its own: a worker given no token looks
        # for the one a tokenless coordinator on its port made, and one that
        # an earlier test's coordinator on the same port left (they stay, so
        # that a restart strands no worker) would be sent instead of none.
        runtime = tempfile.mkdtemp(prefix="ddp-refusal-runtime-")
        worker = Worker(self.cluster.target, "none",
                        env=dict(os.environ, XDG_RUNTIME_DIR=runtime))
        self.assertExits2(worker, "UNAUTHENTICATED", "needs a worker token")

    def test_operator_token_permission_denied(self):
        worker = Worker(self.cluster.target, "op",
                        ["--token_file=" + self.pki.token_files["operator"]])
        self.assertExits2(worker, "PERMISSION_DENIED",
                          "needs a worker token; this token's role is operator")
        # The coordinator says who was refused, and the worker never attached.
        self.assertIn("refused /ddp.v1.Coordinator/Attach", self.cluster.log("coordinator"))
        listed = self.cluster.client.call("ddp.v1.Coordinator/ListWorkers")
        self.assertEqual((listed["workers"], listed["total_size"]), ([], 0))

    def test_unparseable_coordinator_exits_at_once(self):
        for bad in ("127.0.0.1", "127.0.0.1:99999", "http://127.0.0.1:80", "host name:1"):
            worker = Worker(bad, "typo")
            code = worker.wait_exit(timeout=10)
            self.assertEqual(code, 2, worker.log())
            self.assertIn("--coordinator: ", worker.log())
            self.assertLess(time.time() - worker.started, 5)

    def test_unreadable_token_file_exits_at_once(self):
        worker = Worker(self.cluster.target, "nofile", ["--token_file=/nonexistent/token"])
        self.assertEqual(worker.wait_exit(timeout=10), 2)
        self.assertIn("--token_file=/nonexistent/token: No such file", worker.log())


class RetriedRefusalTest(unittest.TestCase):
    """What retrying may cure: the worker keeps going, and says why."""

    def test_duplicate_device_keeps_retrying_then_attaches(self):
        cluster = Cluster()
        self.addCleanup(cluster.stop)
        cluster.start_worker(0)
        wait_for(lambda: cluster.client.call("ddp.v1.Coordinator/ListWorkers").get("workers"), 20,
                 "the first worker")
        twin = Worker(cluster.target, "twin")  # cpu:0 on 127.0.0.1 again
        self.addCleanup(twin.stop)
        twin.wait_log("ALREADY_EXISTS", 15)
        log = twin.log()
        self.assertIn("refused this worker for now", log)
        self.assertIn("device cpu:0 on host 127.0.0.1 is already attached", log)
        self.assertIn("retrying", log)
        time.sleep(2)
        self.assertIsNone(twin.proc.poll(), twin.log())
        # Rate-limited: said once, not once per retry.
        self.assertEqual(twin.log().count("ALREADY_EXISTS"), 1, twin.log())
        # Once the device is free, the retry succeeds.
        cluster.procs[1].send_signal(signal.SIGTERM)
        twin.wait_log("attached to coordinator", 30)

    def test_unreachable_servers_retry_with_the_grpc_error(self):
        """A closed port, an HTTP server and a silent TCP listener, at once."""
        closed = "127.0.0.1:%d" % free_port()

        class Quiet(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        self.addCleanup(httpd.server_close)
        self.addCleanup(httpd.shutdown)

        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # accepted by the kernel; nobody ever answers
        self.addCleanup(silent.close)

        workers = {
            "closed": Worker(closed, "closed"),
            "http": Worker("127.0.0.1:%d" % httpd.server_address[1], "http", device="cpu:1"),
            "silent": Worker("127.0.0.1:%d" % silent.getsockname()[1], "silent",
                             device="cpu:2"),
        }
        for w in workers.values():
            self.addCleanup(w.stop)
        workers["closed"].wait_log("Connection refused", 10)
        workers["http"].wait_log("Failed parsing HTTP/2", 10)
        # The handshake's deadline: no hang on a listener that says nothing.
        workers["silent"].wait_log("no answer to register", REGISTER_TIMEOUT + 10)
        self.assertIn("within 10s", workers["silent"].log())
        for name, w in workers.items():
            self.assertIsNone(w.proc.poll(), "%s exited:\n%s" % (name, w.log()))
            self.assertIn("can't reach the coordinator" if name != "silent" else "retrying",
                          w.log())
        # Several retries have failed by now; each kind was logged once.
        self.assertEqual(workers["closed"].log().count("Connection refused"), 1,
                         workers["closed"].log())
        self.assertEqual(workers["http"].log().count("Failed parsing HTTP/2"), 1)
        # Each still stops promptly, even mid-handshake.
        for name, w in workers.items():
            self.assertEqual(w.stop(), 0, name)

    def test_tls_worker_against_plaintext_coordinator_says_so(self):
        pki = Pki()
        self.addCleanup(pki.remove)
        cluster = Cluster()
        self.addCleanup(cluster.stop)
        worker = Worker(cluster.target, "tls", pki.worker_flags(role=None))
        self.addCleanup(worker.stop)
        worker.wait_log("can't reach the coordinator", 15)
        self.assertIn("UNAVAILABLE", worker.log())
        self.assertIsNone(worker.proc.poll())


if __name__ == "__main__":
    unittest.main(verbosity=2)
