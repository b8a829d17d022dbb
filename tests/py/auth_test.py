#!/usr/bin/python3
"""Authentication and TLS between real processes over real gRPC: a CA and
certificates made with openssl; a coordinator with mutual TLS and a tokens
file; workers training over it; every RPC class tried with no token, an
unknown token and each role (UNAUTHENTICATED / PERMISSION_DENIED, and the
running job never notices); client certificates the CA did not sign refused
in the handshake; the store open only to the members of the generation a
call names; a coordinator that will not listen off loopback without TLS and
tokens; ddp-run passing TLS and tokens through."""
import json
import os
import queue
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc

sys.path.insert(0, os.path.dirname(__file__))
from certs import Pki  # noqa: E402
from cluster import Cluster, synthetic_job  # noqa: E402
from harness import BIN, read_text, wait_for, wait_port_file  # noqa: E402
from grpc_reflect import ReflectionClient, local_token_file  # noqa: E402

C = "ddp.v1.Coordinator/"
UNARY = ["GetStatus", "ListWorkers", "ListJobs", "GetJob", "SubmitJob", "CancelJob", "StoreSet",
         "StoreGet", "StoreAdd"]
ALL = UNARY + ["WatchStatus", "Attach"]
# What each role may call; every other method is PERMISSION_DENIED for it.
ALLOWED = {
    "worker": {"Attach", "StoreSet", "StoreGet", "StoreAdd"},
    "operator": {"GetStatus", "ListWorkers", "WatchStatus", "ListJobs", "GetJob"},
    "admin": {"GetStatus", "ListWorkers", "WatchStatus", "ListJobs", "GetJob", "SubmitJob",
              "CancelJob"},
}


def code_of(fn):
    """(grpc.StatusCode, details) of calling fn; OK when it returns."""
    try:
        fn()
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


class SecureClusterTest(unittest.TestCase):
    """Mutual TLS and tokens around a job that keeps training throughout."""

    @classmethod
    def setUpClass(cls):
        cls.pki = Pki()
        cls.cluster = Cluster(job=synthetic_job("secure", 2, epochs=1000),
                              extra_flags=cls.pki.coordinator_flags(),
                              client_options=cls.pki.client_options("admin"),
                              worker_flags=cls.pki.worker_flags("worker"))
        cls.cluster.start_worker(0)
        cls.cluster.start_worker(1)
        cls.running = cls.cluster.wait_state("JOB_STATE_RUNNING", timeout=60)
        wait_for(lambda: int(cls.cluster.status().get("global_step", 0)) > 0, 60, "a first step")
        cls.clients = {}

    @classmethod
    def tearDownClass(cls):
        for c in cls.clients.values():
            c.close()
        cls.cluster.stop()
        cls.pki.remove()

    def client(self, token_name, client_cert=None):
        """A client with the trusted client certificate and the named token:
        a role, None (no token) or "unknown"."""
        key = (token_name, client_cert)
        if key not in self.clients:
            if token_name == "unknown":
                token = secrets.token_hex(16)
            else:
                token = self.pki.tokens[token_name] if token_name else None
            options = self.pki.client_options(None, client_cert)
            options["token"] = token
            # No token means none: not the token files an earlier coordinator
            # of this user's left for the same port (they outlive it).
            options["local_token"] = False
            self.clients[key] = ReflectionClient(self.cluster.target, **options)
            # Learn the schema with the admin's client: reflection is open,
            # but a client whose handshake fails can't use it.
            self.clients[key].pool = self.cluster.client.pool
            self.clients[key].factory = self.cluster.client.factory
            self.clients[key]._files = self.cluster.client._files
        return self.clients[key]

    def assertUntouched(self):
        s = self.cluster.status()
        self.assertEqual(s["state"], "JOB_STATE_RUNNING", s.get("message"))
        self.assertEqual(s["job_id"], "secure")
        self.assertEqual(s["generation"], self.running["generation"])
        self.assertEqual(len(s["members"]), 2)
        return s

    def generation(self):
        return int(self.running["generation"])

    def try_method(self, client, method):
        g = self.generation()
        store = '{"job_id": "secure", "generation": %d, "key": "k", "value": "dg=="}' % g
        requests = {
            "GetStatus": "{}", "ListWorkers": "{}", "ListJobs": "{}",
            "GetJob": '{"job_id": "secure"}',
            # Were these let through, they would end the running job.
            "SubmitJob": '{"spec": {"name": "other"}}',
            "CancelJob": '{"job_id": "secure", "reason": "an attacker"}',
            "StoreSet": store, "StoreAdd": store.replace('"value": "dg=="', '"delta": 1'),
            "StoreGet": store.replace('"value": "dg=="', '"timeout_seconds": 0.2'),
        }
        if method in requests:
            return code_of(lambda: client.call(C + method, requests[method], timeout=10))
        if method == "WatchStatus":
            watch, request, _ = client.stub(C + method)
            return code_of(lambda: next(iter(watch(request(interval_seconds=0.1), timeout=10))))
        # Attach: a register a real worker would send.
        attach, _, _ = client.stub(C + method)
        register = client.message("ddp.v1.WorkerMessage", {"register": {
            "host": "10.66.0.1", "device": "cpu:0", "version": self.version(), "pid": 1}})

        def attach_once():
            call = attach(iter([register]), timeout=5)
            for _ in call:
                break
        return code_of(attach_once)

    def version(self):
        return self.cluster.status()["workers"][0]["version"]

    def test_no_token_or_unknown_token_unauthenticated_everywhere(self):
        for token in (None, "unknown"):
            for method in ALL:
                code, details = self.try_method(self.client(token), method)
                self.assertEqual(code, grpc.StatusCode.UNAUTHENTICATED,
                                 "%s with token %s: %s" % (method, token, details))
                if token is None:
                    self.assertIn("authorization: Bearer", details)
                else:
                    self.assertIn("unknown bearer token", details)
        self.assertUntouched()

    def test_each_role_only_its_methods(self):
        for role, allowed in ALLOWED.items():
            for method in ALL:
                if method in allowed:
                    continue
                code, details = self.try_method(self.client(role), method)
                self.assertEqual(code, grpc.StatusCode.PERMISSION_DENIED,
                                 "%s as %s: %s" % (method, role, details))
                self.assertIn("this token's role is " + role, details)
                self.assertRegex(details, r"needs an? (worker|operator or admin|admin) token")
        self.assertUntouched()

    def test_allowed_calls_pass_and_still_meet_the_usual_checks(self):
        for role in ("operator", "admin"):
            for method in ("GetStatus", "ListWorkers", "WatchStatus", "ListJobs", "GetJob"):
                code, details = self.try_method(self.client(role), method)
                self.assertEqual(code, grpc.StatusCode.OK, "%s as %s: %s" % (method, role, details))
        admin = self.client("admin")
        # Past the authorizer, the job's own rules still hold.
        self.assertEqual(code_of(lambda: admin.call(
            C + "SubmitJob", '{"spec": {"name": "x", "batchSize": 1000000}}'))[0],
            grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(code_of(lambda: admin.call(C + "CancelJob", '{"job_id": "other"}'))[0],
                         grpc.StatusCode.NOT_FOUND)
        self.assertUntouched()

    def test_worker_token_alone_reaches_no_store(self):
        worker = self.client("worker")
        g = self.generation()
        request = '{"job_id": "secure", "generation": %d, "key": "k", "value": "dg=="}'
        code, details = code_of(lambda: worker.call(C + "StoreSet", request % g))
        self.assertEqual(code, grpc.StatusCode.PERMISSION_DENIED, details)
        self.assertIn("no store token", details)
        guess = [("ddp-store-token", secrets.token_hex(16))]
        bodies = {"StoreSet": request % g,
                  "StoreGet": '{"job_id": "secure", "generation": %d, "key": "k"}' % g,
                  "StoreAdd": '{"job_id": "secure", "generation": %d, "key": "n", "delta": 1}' % g}
        for method, body in bodies.items():
            code, details = code_of(lambda: worker.call(C + method, body, metadata=guess))
            self.assertEqual(code, grpc.StatusCode.PERMISSION_DENIED, details)
            self.assertIn("not one of generation %d's members'" % g, details)
        # Fencing answers first for an older generation, as before.
        code, details = code_of(lambda: worker.call(C + "StoreSet", request % (g + 77),
                                                    metadata=guess))
        self.assertEqual(code, grpc.StatusCode.FAILED_PRECONDITION, details)
        self.assertUntouched()

    def test_health_and_reflection_stay_open(self):
        anonymous = self.client(None)
        health = anonymous.call("grpc.health.v1.Health/Check", '{"service": "ddp.v1.Coordinator"}')
        self.assertEqual(health["status"], "SERVING")
        self.assertIn("ddp.v1.Coordinator", anonymous.list_services())

    def test_unknown_ca_no_certificate_or_plaintext_refused_in_the_handshake(self):
        clients = {
            "a client certificate from another CA":
                ReflectionClient(self.cluster.target, cacert=self.pki.ca,
                                 cert=self.pki.rogue_client[0], key=self.pki.rogue_client[1],
                                 token=self.pki.tokens["admin"]),
            "no client certificate":
                ReflectionClient(self.cluster.target, cacert=self.pki.ca,
                                 token=self.pki.tokens["admin"]),
            "plaintext": ReflectionClient(self.cluster.target, token=self.pki.tokens["admin"]),
            "a server certificate from another CA":
                ReflectionClient(self.cluster.target, cacert=self.pki.rogue_ca,
                                 cert=self.pki.client[0], key=self.pki.client[1]),
        }
        for what, client in clients.items():
            code, details = code_of(lambda: client.call("grpc.health.v1.Health/Check", "{}",
                                                        timeout=5))
            self.assertEqual(code, grpc.StatusCode.UNAVAILABLE, "%s: %s" % (what, details))
            client.close()
        self.assertUntouched()

    def test_worker_with_unknown_certificate_retries_saying_why(self):
        worker = self.cluster._start("rogue", [
            os.path.join(BIN, "ddp-worker"), "--coordinator=" + self.cluster.target,
            "--device=cpu:5", "--host=127.0.0.1", "--name=rogue", "--threads=1"] +
            self.pki.worker_flags("worker", client=self.pki.rogue_client))
        wait_for(lambda: "can't reach the coordinator" in self.cluster.log("rogue"), 20,
                 "the rogue worker to say why")
        self.assertIn("UNAVAILABLE", self.cluster.log("rogue"))
        self.assertIsNone(worker.poll())
        self.assertNotIn("rogue", [w["worker_id"] for w in self.cluster.status()["workers"]])
        worker.send_signal(signal.SIGTERM)
        self.assertEqual(worker.wait(timeout=15), 0)
        self.assertUntouched()

    def test_zz_training_went_on_through_it_all(self):
        before = int(self.assertUntouched()["global_step"])
        wait_for(lambda: int(self.cluster.status()["global_step"]) > before, 30, "more steps")
        workers = self.cluster.status()["workers"]
        self.assertEqual(sorted(w["worker_id"] for w in workers), ["w0", "w1"])
        self.assertIn("mutual TLS, tokens required", self.cluster.log("coordinator"))


class SecureJobSucceedsTest(unittest.TestCase):
    def test_job_over_mutual_tls_with_tokens_succeeds(self):
        pki = Pki()
        self.addCleanup(pki.remove)
        cluster = Cluster(job=synthetic_job("tls-done", 2, maxSteps=20),
                          extra_flags=pki.coordinator_flags(),
                          client_options=pki.client_options("operator"),
                          worker_flags=pki.worker_flags("worker"))
        self.addCleanup(cluster.stop)
        cluster.start_worker(0)
        cluster.start_worker(1)
        done = cluster.wait_state(["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"], timeout=120)
        self.assertEqual(done["state"], "JOB_STATE_SUCCEEDED", done.get("message"))
        self.assertEqual(done["global_step"], "20")
        for w in done["workers"]:
            self.assertEqual(w["probe"]["observed"], 3)  # the ring works: 1 + 2
            self.assertEqual(w["probe"]["backend"], "gloo")


class FakeWorker:
    """An Attach stream with a worker token, speaking for a worker that
    never trains: it heartbeats, keeps its assignments, and leaves a
    generation when told to."""

    def __init__(self, client, host, version):
        self.client = client
        self.assignments = []
        self.outbox = queue.Queue()
        self.closed = threading.Event()
        attach, _, _ = client.stub(C + "Attach")
        first = client.message("ddp.v1.WorkerMessage", {"register": {
            "host": host, "device": "cpu:0", "version": version, "pid": 4242}})
        self.call = attach(self._requests(first))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _requests(self, first):
        yield first
        while not self.closed.is_set():
            try:
                yield self.outbox.get(timeout=0.3)
            except queue.Empty:
                yield self.client.message("ddp.v1.WorkerMessage", {"heartbeat": {}})

    def _read(self):
        try:
            for reply in self.call:
                r = self.client.to_dict(reply)
                if "assignment" in r:
                    self.assignments.append(r["assignment"])
                if "prepare" in r:  # it holds the job's state at once
                    self.outbox.put(self.client.message("ddp.v1.WorkerMessage", {"state": {
                        "state": "WORKER_STATE_IDLE", "held": {
                            "jobId": r["prepare"]["job_id"],
                            "specDigest": r["prepare"]["spec_digest"]}}}))
                if "abort" in r:
                    self.outbox.put(self.client.message("ddp.v1.WorkerMessage", {"state": {
                        "generation": r["abort"]["generation"], "state": "WORKER_STATE_IDLE"}}))
        except grpc.RpcError:
            pass

    def token(self, generation):
        for a in self.assignments:
            if int(a["generation"]) == generation:
                return a["store_token"]
        return None

    def close(self):
        self.closed.set()
        self.call.cancel()


def coordinator_version(client):
    """The coordinator's version, from its own refusal of another one."""
    attach, _, _ = client.stub(C + "Attach")
    register = client.message("ddp.v1.WorkerMessage", {"register": {
        "host": "10.66.0.9", "device": "cpu:0", "version": "none", "pid": 1}})
    code, details = code_of(lambda: list(attach(iter([register]), timeout=5)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION, details
    return details.split("the coordinator's \"")[1].split('"')[0]


class StoreCapabilityTest(unittest.TestCase):
    """The store of a generation, open to its members' store tokens only."""

    def test_only_members_of_the_named_generation(self):
        pki = Pki()
        self.addCleanup(pki.remove)
        # Tokens on loopback without TLS: required there too.
        cluster = Cluster(job=synthetic_job("fenced", 2, epochs=1000),
                          extra_flags=["--tokens_file=" + pki.tokens_file],
                          client_options=dict(token=pki.tokens["operator"]))
        self.addCleanup(cluster.stop)
        worker = ReflectionClient(cluster.target, token=pki.tokens["worker"])
        self.addCleanup(worker.close)
        version = coordinator_version(worker)
        fakes = {}
        for name in ("a", "b"):
            fakes[name] = FakeWorker(worker, "10.66.1.%d" % (len(fakes) + 1), version)
            self.addCleanup(fakes[name].close)
        wait_for(lambda: fakes["a"].token(1) and fakes["b"].token(1), 30, "generation 1")

        def store_set(generation, store_token, client=worker):
            request = '{"job_id": "fenced", "generation": %d, "key": "k", "value": "dg=="}'
            metadata = [("ddp-store-token", store_token)] if store_token else None
            return code_of(lambda: client.call(C + "StoreSet", request % generation,
                                               metadata=metadata))

        a1, b1 = fakes["a"].token(1), fakes["b"].token(1)
        self.assertNotEqual(a1, b1)
        self.assertEqual(len(a1), 32)  # 128 bits, hex
        self.assertEqual(store_set(1, a1)[0], grpc.StatusCode.OK)
        self.assertEqual(store_set(1, b1)[0], grpc.StatusCode.OK)
        self.assertEqual(store_set(1, None)[0], grpc.StatusCode.PERMISSION_DENIED)
        self.assertEqual(store_set(1, secrets.token_hex(16))[0], grpc.StatusCode.PERMISSION_DENIED)
        # A store token is no bearer token: an operator holding one is refused.
        code, details = store_set(1, a1, client=cluster.client)
        self.assertEqual(code, grpc.StatusCode.PERMISSION_DENIED)
        self.assertIn("needs a worker token", details)

        # b goes; c comes; generation 2 forms with a and c, and new tokens.
        fakes["b"].close()
        fakes["c"] = FakeWorker(worker, "10.66.1.3", version)
        self.addCleanup(fakes["c"].close)
        wait_for(lambda: fakes["a"].token(2) and fakes["c"].token(2), 60, "generation 2")
        a2 = fakes["a"].token(2)
        self.assertNotIn(a2, (a1, b1))
        self.assertEqual(store_set(2, a2)[0], grpc.StatusCode.OK)
        self.assertEqual(store_set(2, fakes["c"].token(2))[0], grpc.StatusCode.OK)
        # Another generation's token, its own member's or a departed worker's.
        for old in (a1, b1):
            code, details = store_set(2, old)
            self.assertEqual(code, grpc.StatusCode.PERMISSION_DENIED, details)
            self.assertIn("not one of generation 2's members'", details)
        # The old generation itself is fenced off, as before.
        code, details = store_set(1, a1)
        self.assertEqual(code, grpc.StatusCode.FAILED_PRECONDITION, details)
        self.assertIn("stale generation 1", details)


class ListenPolicyTest(unittest.TestCase):
    """Secure by default: off loopback, TLS and tokens, or --insecure."""

    @classmethod
    def setUpClass(cls):
        cls.pki = Pki()

    @classmethod
    def tearDownClass(cls):
        cls.pki.remove()

    def run_coordinator(self, *flags):
        return subprocess.run([os.path.join(BIN, "ddp-coordinator")] + list(flags),
                              capture_output=True, text=True, timeout=60)

    def serve(self, *flags):
        """Starts a coordinator expected to serve; returns (process, port)."""
        folder = tempfile.mkdtemp(prefix="ddp-listen-")
        port_file = os.path.join(folder, "port")
        log = open(os.path.join(folder, "log"), "w+")
        p = subprocess.Popen([os.path.join(BIN, "ddp-coordinator"), "--port_file=" + port_file] +
                             list(flags), stdout=log, stderr=subprocess.STDOUT)

        def stop():
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=15)
            log.close()
        self.addCleanup(stop)

        try:
            port = wait_port_file(port_file, 30, "the coordinator to serve", p)
        except AssertionError as e:
            log.seek(0)
            raise AssertionError("%s: %s" % (e, log.read())) from None
        log.seek(0)
        return p, port, log.read()

    def test_any_address_without_tls_or_tokens_exits_2_saying_what_to_set(self):
        result = self.run_coordinator("--listen=0.0.0.0:0")
        self.assertEqual(result.returncode, 2, result.stderr)
        for words in ("refusing to listen on 0.0.0.0:0", "--tls_cert", "--tls_key",
                      "--tokens_file", "--insecure", "--tls_ca"):
            self.assertIn(words, result.stderr)

    def test_tls_without_tokens_names_only_what_is_missing(self):
        result = self.run_coordinator("--listen=[::]:0", *self.pki.coordinator_flags(tokens=False))
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("without --tokens_file", result.stderr)
        self.assertNotIn("without --tls_cert", result.stderr)
        result = self.run_coordinator("--listen=0.0.0.0:0", "--tokens_file=" + self.pki.tokens_file)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("without --tls_cert and --tls_key (TLS):", result.stderr)

    def test_insecure_serves_and_warns(self):
        _, port, log = self.serve("--listen=0.0.0.0:0", "--insecure")
        self.assertIn("--insecure: serving 0.0.0.0:0 without TLS or tokens", log)
        client = ReflectionClient("127.0.0.1:%d" % port)
        self.addCleanup(client.close)
        self.assertEqual(client.call(C + "GetStatus")["state"], "JOB_STATE_UNSPECIFIED")

    def test_tls_and_tokens_serve_off_loopback(self):
        _, port, log = self.serve("--listen=0.0.0.0:0", *self.pki.coordinator_flags())
        self.assertIn("mutual TLS, tokens required", log)
        client = ReflectionClient("127.0.0.1:%d" % port, **self.pki.client_options("operator"))
        self.addCleanup(client.close)
        self.assertEqual(client.call(C + "GetStatus")["state"], "JOB_STATE_UNSPECIFIED")

    def test_tokens_file_on_loopback_requires_tokens_there_too(self):
        _, port, _ = self.serve("--listen=127.0.0.1:0", "--tokens_file=" + self.pki.tokens_file)
        client = ReflectionClient("127.0.0.1:%d" % port)
        self.addCleanup(client.close)
        self.assertEqual(code_of(lambda: client.call(C + "GetStatus"))[0],
                         grpc.StatusCode.UNAUTHENTICATED)

    def test_tokens_file_others_may_read_exits_2_unless_allowed(self):
        readable = os.path.join(self.pki.dir, "readable-tokens")
        shutil.copy(self.pki.tokens_file, readable)
        os.chmod(readable, 0o644)
        result = self.run_coordinator("--listen=127.0.0.1:0", "--tokens_file=" + readable)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("--tokens_file=%s: other users may read it (mode 644)" % readable,
                      result.stderr)
        self.assertIn("--allow_readable_tokens", result.stderr)
        for token in self.pki.tokens.values():
            self.assertNotIn(token, result.stderr)
        _, port, log = self.serve("--listen=127.0.0.1:0", "--tokens_file=" + readable,
                                  "--allow_readable_tokens")
        self.assertIn("other users may read it", log)  # still warned

    def test_status_page_under_slow_clients_answers_an_operator(self):
        """The coordinator's own page with its flags: 200 connections trickling
        their heads from 13 addresses leave an operator answered within a
        second, and are cut off once --http_header_timeout is up."""
        folder = tempfile.mkdtemp(prefix="ddp-slow-")
        self.addCleanup(shutil.rmtree, folder, True)
        page_file = os.path.join(folder, "page")
        self.serve("--listen=127.0.0.1:0", "--metrics_listen=", "--http_listen=127.0.0.1:0",
                   "--http_port_file=" + page_file, "--tokens_file=" + self.pki.tokens_file,
                   "--http_header_timeout=3s")
        port = wait_port_file(page_file, 30, "the status page")
        slow = []
        self.addCleanup(lambda: [s.close() for s in slow])
        for i in range(200):
            s = socket.socket()
            s.settimeout(5)
            s.bind(("127.0.0.%d" % (2 + i // 16), 0))
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /api/status HTTP/1.1\r\nX-Slow: 1\r\n")
            slow.append(s)
        started = time.time()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.sendall(b"GET /api/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n"
                      % self.pki.tokens["operator"].encode())
            self.assertTrue(c.recv(64).startswith(b"HTTP/1.1 200"))
        self.assertLess(time.time() - started, 1.0)
        # Every slow one is cut off once its 3 s are up, though it trickled.
        deadline = time.time() + 10
        for s in slow:
            s.settimeout(max(0.1, deadline - time.time()))
            try:
                s.sendall(b"X-Slow: 2\r\n")
                self.assertEqual(s.recv(64), b"")
            except OSError:
                pass  # reset: closed as well
        self.assertLess(time.time() - started, 10)

    def test_status_page_per_address_cap_ends_the_oldest_unfinished_request(self):
        folder = tempfile.mkdtemp(prefix="ddp-cap-")
        self.addCleanup(shutil.rmtree, folder, True)
        page_file = os.path.join(folder, "page")
        self.serve("--listen=127.0.0.1:0", "--metrics_listen=", "--http_listen=127.0.0.1:0",
                   "--http_port_file=" + page_file, "--http_max_connections_per_address=2")
        port = wait_port_file(page_file, 30, "the status page")
        held = []
        self.addCleanup(lambda: [s.close() for s in held])
        for _ in range(2):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=2,
                                                 source_address=("127.0.0.7", 0)))
            held[-1].sendall(b"GET / HTTP/1.1\r\n")
            time.sleep(0.1)  # accepted in this order
        third = socket.create_connection(("127.0.0.1", port), timeout=2,
                                         source_address=("127.0.0.7", 0))
        self.addCleanup(third.close)
        try:
            self.assertEqual(held[0].recv(64), b"")  # the oldest, ended
        except ConnectionResetError:
            pass
        third.sendall(b"GET /api/status HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertTrue(third.recv(64).startswith(b"HTTP/1.1 200"))
        result = self.run_coordinator("--http_max_connections_per_address=0")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("the connection caps must be at least 1", result.stderr)

    def test_anonymous_caller_of_another_version_is_not_told_ours(self):
        _, port, _ = self.serve("--listen=127.0.0.1:0", "--allow_anonymous_loopback")
        client = ReflectionClient("127.0.0.1:%d" % port)
        self.addCleanup(client.close)
        attach, _, _ = client.stub(C + "Attach")
        register = client.message("ddp.v1.WorkerMessage", {"register": {
            "host": "10.66.0.9", "device": "cpu:0", "version": "none", "pid": 1}})
        code, details = code_of(lambda: list(attach(iter([register]), timeout=5)))
        self.assertEqual(code, grpc.StatusCode.FAILED_PRECONDITION, details)
        version = subprocess.run([os.path.join(BIN, "ddp-coordinator"), "--version"],
                                 capture_output=True, text=True).stdout.split()[-1]
        self.assertNotIn(version, details)
        self.assertIn("ddp-coordinator --version", details)

    def test_unreadable_or_mismatched_files_exit_2_naming_flag_and_file(self):
        pki = self.pki
        cert, key = pki.server
        bad_tokens = os.path.join(pki.dir, "bad-tokens")
        with open(bad_tokens, "w") as f:
            f.write("worker 0123456789abcdef0123\nroot 0123456789abcdef0124\n")
        os.chmod(bad_tokens, 0o600)
        cases = [
            (["--tls_cert=/nonexistent.crt", "--tls_key=" + key],
             "--tls_cert=/nonexistent.crt: No such file or directory"),
            (["--tls_cert=" + cert], "--tls_cert=%s needs --tls_key" % cert),
            (["--tls_ca=" + pki.ca], "--tls_ca=%s needs --tls_cert and --tls_key" % pki.ca),
            (["--tls_cert=" + cert, "--tls_key=" + pki.client[1]],
             "--tls_key=%s: is not the key of the certificate" % pki.client[1]),
            (["--tls_cert=" + pki.tokens_file, "--tls_key=" + key],
             "--tls_cert=%s: no PEM certificate" % pki.tokens_file),
            (["--tls_cert=" + cert, "--tls_key=" + key, "--tls_ca=" + key],
             "--tls_ca=%s: no PEM certificate" % key),
            (["--tokens_file=/nonexistent"], "--tokens_file=/nonexistent: No such file"),
            (["--tokens_file=" + bad_tokens],
             "--tokens_file=%s: line 2: unknown role \"root\"" % bad_tokens),
        ]
        for flags, message in cases:
            result = self.run_coordinator("--listen=127.0.0.1:0", *flags)
            self.assertEqual(result.returncode, 2, "%s: %s" % (flags, result.stderr))
            self.assertIn(message, result.stderr, flags)
            self.assertNotIn("0123456789abcdef0124", result.stderr)  # no token quoted


class OwnersTest(unittest.TestCase):
    """Owners isolated through real gRPC with a tokens file: each owner's
    share of the queue and priority class, cancel of its own jobs only
    (scope=all for every owner's), and who cancelled in the job's message."""

    def test_owner_limits_and_cancel_scope(self):
        folder = tempfile.mkdtemp(prefix="ddp-owners-")
        tokens = {name: secrets.token_hex(16) for name in ("alice", "bob", "ops", "worker")}
        path = os.path.join(folder, "tokens")
        with open(path, "w") as f:
            f.write("worker %s\n" % tokens["worker"])
            f.write("admin %s owner=alice max_queued=2\n" % tokens["alice"])
            f.write("admin %s owner=bob max_priority=5\n" % tokens["bob"])
            f.write("admin %s owner=ops scope=all max_priority=100\n" % tokens["ops"])
        os.chmod(path, 0o600)
        cluster = Cluster(extra_flags=["--tokens_file=" + path],
                          client_options={"token": tokens["ops"], "local_token": False})
        self.addCleanup(cluster.stop)
        clients = {}
        for name in ("alice", "bob", "ops"):
            clients[name] = ReflectionClient(cluster.target, token=tokens[name], local_token=False)
            self.addCleanup(clients[name].close)

        def submit(who, name, **overrides):
            job = synthetic_job(name, 1, **overrides)
            return code_of(lambda: clients[who].call(C + "SubmitJob",
                                                     json.dumps({"spec": job}), timeout=30))

        def cancel(who, name):
            return code_of(lambda: clients[who].call(
                C + "CancelJob", json.dumps({"job_id": name, "reason": "tidying up"}), timeout=30))

        # No worker: the first job waits for one, the rest queue.
        self.assertEqual(submit("bob", "b0")[0], grpc.StatusCode.OK)
        self.assertEqual(submit("alice", "a1")[0], grpc.StatusCode.OK)
        self.assertEqual(submit("alice", "a2")[0], grpc.StatusCode.OK)
        code, details = submit("alice", "a3")
        self.assertEqual(code, grpc.StatusCode.RESOURCE_EXHAUSTED, details)
        self.assertIn('"alice" has 2 job(s) queued', details)
        # Priority classes: alice's is 0 (the default), bob's 5.
        code, details = submit("alice", "a-urgent", priority=2147483647)
        self.assertEqual(code, grpc.StatusCode.PERMISSION_DENIED, details)
        self.assertIn("max_priority", details)
        self.assertEqual(submit("bob", "b5", priority=5)[0], grpc.StatusCode.OK)
        self.assertEqual(submit("bob", "b6", priority=6)[0], grpc.StatusCode.PERMISSION_DENIED)
        # Cancel: one's own jobs, or any with scope=all.
        code, details = cancel("bob", "a1")
        self.assertEqual(code, grpc.StatusCode.PERMISSION_DENIED, details)
        self.assertIn('belongs to "alice"', details)
        self.assertEqual(cancel("alice", "a1")[0], grpc.StatusCode.OK)
        self.assertEqual(cancel("ops", "b5")[0], grpc.StatusCode.OK)
        jobs = {j["job_id"]: j for j in cluster.client.call(C + "ListJobs").get("jobs", [])}
        self.assertIn("by alice: tidying up", jobs["a1"]["message"])
        self.assertIn("by ops: tidying up", jobs["b5"]["message"])
        self.assertEqual(jobs["a2"]["state"], "JOB_STATE_QUEUED")
        log = read_text(os.path.join(cluster.dir, "coordinator.log")) or ""
        self.assertIn("by alice: tidying up", log)


class LocalTokensTest(unittest.TestCase):
    """No anonymous admin, even on loopback (issue 20, item 5): without
    --tokens_file the coordinator makes a worker and an admin token, in
    files only its user may read; that user's workers and clients find them
    by port; anyone else is UNAUTHENTICATED. --allow_anonymous_loopback
    restores anonymous calls, explicitly."""

    def test_anonymous_callers_refused_and_the_users_own_workers_train(self):
        cluster = Cluster()
        self.addCleanup(cluster.stop)
        anonymous = ReflectionClient(cluster.target, local_token=False)
        self.addCleanup(anonymous.close)
        for method in ("GetStatus", "SubmitJob", "CancelJob", "StoreSet"):
            code, details = code_of(lambda: anonymous.call(C + method))
            self.assertEqual(code, grpc.StatusCode.UNAUTHENTICATED, (method, details))
        admin = local_token_file(cluster.target, "admin")
        worker = local_token_file(cluster.target, "worker")
        for path in (admin, worker):
            self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600, path)
        self.assertEqual(stat.S_IMODE(os.stat(os.path.dirname(admin)).st_mode), 0o700)
        # The user's own: a client with the admin token, workers that
        # found theirs.
        call, _, _ = cluster.client.stub(C + "SubmitJob")
        call(cluster.client.message("ddp.v1.SubmitJobRequest",
                                    {"spec": synthetic_job("local", 2, maxSteps=20)}), timeout=60)
        cluster.start_worker(0)
        cluster.start_worker(1)
        done = cluster.wait_state(["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"], timeout=120)
        self.assertEqual(done["state"], "JOB_STATE_SUCCEEDED", done.get("message"))

    def test_a_port_the_system_picked_has_its_token_files_removed_at_a_clean_stop(self):
        # Nothing restarts on such a port to need them (a fixed port's
        # stay: a restart there keeps its workers' tokens).
        cluster = Cluster()
        self.addCleanup(cluster.stop)
        paths = [local_token_file(cluster.target, role) for role in ("admin", "worker")]
        self.assertTrue(all(paths), paths)
        cluster.stop()
        for path in paths:
            self.assertFalse(os.path.exists(path), path)

    def test_allow_anonymous_loopback_restores_anonymous_calls(self):
        started = time.time()
        cluster = Cluster(extra_flags=["--allow_anonymous_loopback"])
        self.addCleanup(cluster.stop)
        # None written by it (one an earlier coordinator on the same port
        # left may be there: they outlive their coordinator by design).
        admin = local_token_file(cluster.target, "admin")
        self.assertTrue(admin is None or os.stat(admin).st_mtime < started - 1, admin)
        anonymous = ReflectionClient(cluster.target, local_token=False)
        self.addCleanup(anonymous.close)
        self.assertIsInstance(anonymous.call(C + "GetStatus"), dict)  # answered


class LauncherTest(unittest.TestCase):
    """ddp-run passes TLS and tokens through to its coordinator and workers."""

    def test_ddp_run_over_mutual_tls_with_tokens(self):
        pki = Pki()
        self.addCleanup(pki.remove)
        logs = tempfile.mkdtemp(prefix="ddp-run-tls-")
        job = os.path.join(logs, "job.json")
        with open(job, "w") as f:
            json.dump(synthetic_job("run-tls", 2, maxSteps=20), f)
        run = subprocess.run(
            [os.path.join(BIN, "ddp-run"), "--nproc=2", "--job=" + job, "--log_dir=" + logs,
             "--tls_cert=" + pki.server[0], "--tls_key=" + pki.server[1],
             "--tls_ca=" + pki.ca, "--tokens_file=" + pki.tokens_file],
            capture_output=True, text=True, timeout=300)
        self.assertEqual(run.returncode, 0, run.stdout[-2000:] + run.stderr[-2000:])
        with open(os.path.join(logs, "coordinator.log")) as f:
            self.assertIn("mutual TLS, tokens required", f.read())
        token_file = os.path.join(logs, "worker.token")
        self.assertEqual(stat.S_IMODE(os.stat(token_file).st_mode), 0o600)
        with open(os.path.join(logs, "worker-0.log")) as f:
            self.assertIn("attached to coordinator", f.read())
        # Progress came through the operator's channel.
        self.assertIn("step", run.stdout)

    def test_ddp_run_half_tls_flags_exit_2(self):
        pki = Pki()
        self.addCleanup(pki.remove)
        run = subprocess.run([os.path.join(BIN, "ddp-run"), "--nproc=1",
                              "--tls_cert=" + pki.server[0], "--tls_key=" + pki.server[1]],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 2, run.stderr)
        self.assertIn("--tls_cert, --tls_key and --tls_ca go together", run.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
