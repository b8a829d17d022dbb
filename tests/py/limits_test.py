#!/usr/bin/python3
"""Floods a running coordinator over real gRPC with everything a client can
make it hold, and checks each refusal's code and message, that GetStatus
keeps answering and stays small, that a job training alongside keeps
stepping and succeeds, and that the coordinator's memory (VmRSS, read from
/proc) comes back within a bound:

  - a fake worker with a huge host name, a forged log line, many
    unused-parameter names, a huge detail, an absurd step;
  - rendezvous store keys, values, a namespace filled up, StoreAdd overflow,
    20,000 StoreGets whose callers gave up;
  - WatchStatus streams, silent Attach streams, garbage bytes on Attach, a
    worker that never reads its stream."""
import os
import queue
import re
import subprocess
import sys
import threading
import time
import unittest

import grpc

sys.path.insert(0, os.path.dirname(__file__))
from cluster import Cluster, synthetic_job  # noqa: E402
from harness import BIN, wait_for  # noqa: E402
from grpc_reflect import _Metadata, local_token_file  # noqa: E402

ATTACH = "/ddp.v1.Coordinator/Attach"
MAX_ATTACH_STREAMS = 12
FORGED = "2026-01-01 00:00:00.000 I coordinator] job steady cancelled by an operator"


def rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) / 1024.0


class Stream:
    """An Attach stream driven by hand: messages go when sent; replies are
    collected on a thread unless `read` is False (a worker that never reads)."""

    def __init__(self, cluster, read=True, raw=False, channel=None):
        self.client = cluster.client
        self.requests = queue.Queue()
        if raw or channel:
            attach = (channel or cluster.client.channel).stream_stream(
                ATTACH, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        else:
            attach, _, _ = cluster.client.stub("ddp.v1.Coordinator/Attach")
        self.raw = bool(raw or channel)
        self.call = attach(iter(self.requests.get, None))
        self.replies = []
        self.error = None
        self.done = threading.Event()
        self.reading = read
        if read:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for reply in self.call:
                self.replies.append(reply if isinstance(reply, bytes) else
                                    self.client.to_dict(reply))
        except grpc.RpcError as e:
            self.error = e
        self.done.set()

    def send(self, message):
        if not isinstance(message, bytes):
            message = self.client.message("ddp.v1.WorkerMessage", message)
            if self.raw:
                message = message.SerializeToString()
        self.requests.put(message)

    def end(self):
        self.requests.put(None)

    def wait_reply(self, kind, timeout=20):
        return wait_for(lambda: next((r[kind] for r in self.replies if kind in r), None),
                        timeout, "a %s reply" % kind)

    def finished(self, timeout=20):
        """The stream's final status code and details. gRPC gives a client the
        status only once it has read every message before it."""
        if not self.reading:
            self._read()
        if not self.done.wait(timeout):
            raise AssertionError("the stream did not end")
        return self.call.code(), self.call.details() or ""


class LimitsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # A long heartbeat timeout: the worker that never reads must be cut
        # off for that, however slowly this machine sends its flood.
        cls.cluster = Cluster(heartbeat_timeout="30s", extra_flags=["--max_attach_streams=%d" % MAX_ATTACH_STREAMS,
                                           "--register_deadline=2s"])
        cls.pid = cls.cluster.coordinator.pid
        cls.version = cls.coordinator_version()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    @classmethod
    def coordinator_version(cls):
        """The version (an anonymous caller's refusal doesn't name it)."""
        out = subprocess.run([os.path.join(BIN, "ddp-coordinator"), "--version"],
                             capture_output=True, text=True, check=True).stdout
        return out.split()[-1]

    def register(self, host="fake-host", name="fake", **extra):
        r = {"host": host, "device": "cpu:0", "version": self.version, "pid": 1, "name": name}
        r.update(extra)
        return {"register": r}

    def call(self, method, request, timeout=30):
        return self.cluster.client.call("ddp.v1.Coordinator/" + method, request, timeout)

    def status_bytes(self):
        """GetStatus answers, and how big the answer is."""
        call, request, _ = self.cluster.client.stub("ddp.v1.Coordinator/GetStatus")
        return call(request(), timeout=10).ByteSize()

    def step(self):
        return int(self.cluster.status().get("global_step", 0))

    def assertStillTraining(self, since):
        """The job is untouched: it stepped on from `since`, or finished."""
        s = wait_for(lambda: (lambda s: s if s["state"] == "JOB_STATE_SUCCEEDED" or
                              int(s.get("global_step", 0)) > since else None)(
                                  self.cluster.status()), 60, "more steps")
        self.assertIn(s["state"], ["JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED"], s.get("message"))
        self.assertEqual(s["generation"], self.generation)
        # Lost fake workers stay listed (with their names) for a while.
        self.assertLess(self.status_bytes(), 512 << 10)
        return int(s.get("global_step", 0))

    def rss_back_within(self, base, bound_mb, when):
        """The coordinator's VmRSS once it is within `bound_mb` of `base`
        (it may take a few seconds to hand memory back)."""
        deadline = time.time() + 20
        while True:
            rss = rss_mb(self.pid)
            if rss - base < bound_mb or time.time() > deadline:
                break
            time.sleep(0.5)
        self.assertLess(rss - base, bound_mb, "coordinator VmRSS %.0f MB %s, %.0f MB before"
                        % (rss, when, base))
        return rss

    def phase(self, what):
        print("%.1fs: %s" % (time.time() - self.started, what), file=sys.stderr, flush=True)

    def test_fake_worker_and_a_job_alongside(self):
        self.started = time.time()
        self.phase("a fake worker (logs in %s)" % self.cluster.dir)
        self.fake_worker_bounded()
        self.phase("a job alongside")
        self.start_real_job()
        before = rss_mb(self.pid)
        step = self.step()
        self.phase("the store")
        self.store_limits()
        after_store = rss_mb(self.pid)  # the namespace's ~64 MiB, until the generation ends
        step = self.assertStillTraining(step)
        self.phase("abandoned StoreGets")
        self.abandoned_store_gets()
        peak = rss_mb(self.pid)
        # Was ~300 MB, held for an hour; the coordinator hands free memory
        # back every few seconds.
        after_gets = self.rss_back_within(after_store, 48, "after 20,000 abandoned StoreGets")
        step = self.assertStillTraining(step)
        self.phase("WatchStatus streams")
        self.watch_streams()
        self.phase("silent Attach streams")
        self.silent_attach_streams()
        self.phase("garbage on Attach")
        self.garbage_on_attach()
        step = self.assertStillTraining(step)
        self.phase("a worker that never reads")
        self.worker_that_never_reads()
        self.assertStillTraining(step)
        done = self.cluster.wait_state(["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"], timeout=300)
        self.assertEqual(done["state"], "JOB_STATE_SUCCEEDED", done["message"])
        self.assertEqual(done["generation"], self.generation)
        # The namespace's 64 MiB left with the generation; the floods left
        # nothing behind.
        final = self.rss_back_within(before, 48, "at the end")
        print("coordinator VmRSS: %.0f MB with the job running, %.0f MB with the store full, "
              "%.0f MB during 20,000 abandoned StoreGets, %.0f MB after them, %.0f MB at the end"
              % (before, after_store, peak, after_gets, final), file=sys.stderr)
        self.phase("done")
        log = self.cluster.log("coordinator")
        self.assertNotIn("\n" + FORGED, log)
        self.assertIn("\\n" + FORGED, log)  # escaped, inside the line that logged it

    def fake_worker_bounded(self):
        """Before any job: a fake worker's registration and reports."""
        huge = Stream(self.cluster)
        huge.send(self.register(host="h" * 2500000))
        code, details = huge.finished()
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, details)
        self.assertIn("register.host", details)
        self.assertIn("limit is 253 bytes", details)
        self.assertLess(len(details), 400)
        forged = Stream(self.cluster)
        forged.send(self.register(host="evil\n" + FORGED))
        code, details = forged.finished()
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, details)
        self.assertIn("printable ASCII", details)
        self.assertEqual(self.call("ListWorkers", "{}").get("workers", []), [])

        fake = Stream(self.cluster)
        fake.send(self.register())
        fake.wait_reply("registered")
        self.call("SubmitJob", '{"spec": {"name": "names", "dataset": {"kind": "synthetic"},'
                  ' "minWorkers": 1, "settleSeconds": 0, "backend": "gloo"}}')
        prepare = fake.wait_reply("prepare")  # says it holds the job's state
        fake.send({"state": {"state": "WORKER_STATE_IDLE", "held": {
            "jobId": prepare["job_id"], "specDigest": prepare["spec_digest"]}}})
        generation = int(fake.wait_reply("assignment")["generation"])
        fake.send({"state": {"generation": generation, "state": "WORKER_STATE_TRAINING",
                             "detail": "d" * (3 << 20)}})
        for i in range(12):  # 12,000 new names: 10,000 kept
            names = ["layer%d.block%d.weight" % (i, j) for j in range(1000)]
            fake.send({"reports": {"reports": [{
                "generation": generation, "step": i + 1, "loss": 0.5, "stepSeconds": 0.01,
                "reduction": {"newlyUnusedParameterNames": names}}]}})
        fake.send({"reports": {"reports": [{
            "generation": generation, "step": 13, "loss": "NaN",
            "reduction": {"newlyUnusedParameterNames": ["p" * 300] * 5}}]}})
        fake.send({"reports": {"reports": [{"generation": generation, "step": 2 ** 64 - 1}]}})
        rejected = fake.wait_reply("rejected")
        self.assertEqual(rejected["code"], grpc.StatusCode.INVALID_ARGUMENT.value[0])
        self.assertIn("2^40", rejected["message"])
        status = wait_for(lambda: (lambda s: s if s["workers"][0]["step"] == "13" else None)(
            self.cluster.status()), 30, "the fake worker's reports")
        w = status["workers"][0]
        self.assertEqual(len(w["unused_parameters"]), 10000)
        self.assertEqual(w["unused_parameter_names_dropped"], "2005")
        self.assertLessEqual(len(w["detail"]), 1024)
        self.assertEqual(w["last_loss"], "NaN")
        self.assertLess(self.status_bytes(), 512 << 10)
        # A failure whose detail forges a log line: one line, escaped.
        fake.send({"state": {"generation": generation, "state": "WORKER_STATE_FAILED",
                             "code": 3, "detail": "bad data\n" + FORGED}})
        failed = self.cluster.wait_state("JOB_STATE_FAILED", timeout=30)
        self.assertIn(FORGED, failed["message"])
        fake.end()
        fake.finished()

    def start_real_job(self):
        self.cluster.start_worker(0)
        self.cluster.start_worker(1)
        wait_for(lambda: len([w for w in self.call("ListWorkers", "{}").get("workers", [])
                              if w["state"] == "WORKER_STATE_IDLE"]) == 2, 60, "two workers")
        job = synthetic_job("steady", 2, epochs=1000, maxSteps=10000)
        request = self.cluster.client.message("ddp.v1.SubmitJobRequest", {"spec": job})
        call, _, _ = self.cluster.client.stub("ddp.v1.Coordinator/SubmitJob")
        call(request, timeout=60)
        running = self.cluster.wait_state("JOB_STATE_RUNNING", timeout=60)
        self.generation = running["generation"]
        wait_for(lambda: self.step() > 0, 60, "a first step")

    def store_call(self, method, key, **fields):
        call, request, _ = self.cluster.client.stub("ddp.v1.Coordinator/" + method)
        return call(request(job_id="steady", generation=int(self.generation), key=key, **fields),
                    timeout=30)

    def assertStoreRefused(self, code, fragment, method, key, **fields):
        with self.assertRaises(grpc.RpcError) as e:
            self.store_call(method, key, **fields)
        self.assertEqual(e.exception.code(), code, e.exception.details())
        self.assertIn(fragment, e.exception.details())
        self.assertLess(len(e.exception.details()), 400)

    def store_limits(self):
        self.assertStoreRefused(grpc.StatusCode.INVALID_ARGUMENT, "key limit is 512 bytes",
                                "StoreSet", "k" * 600)
        self.assertStoreRefused(grpc.StatusCode.RESOURCE_EXHAUSTED, "value limit is 1048576 bytes",
                                "StoreSet", "big", value=b"v" * ((1 << 20) + 1))
        self.store_call("StoreAdd", "n", delta=2 ** 63 - 1)
        self.assertStoreRefused(grpc.StatusCode.OUT_OF_RANGE, "does not fit", "StoreAdd", "n",
                                delta=1)
        refused = None
        for i in range(70):
            try:
                self.store_call("StoreSet", "fill-%d" % i, value=b"v" * (1 << 20))
            except grpc.RpcError as e:
                refused = e
                break
        self.assertIsNotNone(refused, "64 MiB of values accepted in one namespace")
        self.assertEqual(refused.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, refused.details())
        self.assertIn("limit per namespace is 67108864 bytes", refused.details())
        self.assertGreaterEqual(i, 60)

    def abandoned_store_gets(self):
        """20,000 gets for a key never set: half cancelled by their caller, half
        past the deadline the caller gave; the coordinator drops each at once."""
        call, request, _ = self.cluster.client.stub("ddp.v1.Coordinator/StoreGet")
        get = request(job_id="steady", generation=int(self.generation), key="never",
                      timeout_seconds=3600)
        for _ in range(4):
            futures = [call.future(get, timeout=3) for _ in range(5000)]
            for f in futures[::2]:
                f.cancel()
            codes = set()
            for f in futures:
                try:
                    f.result()
                except grpc.FutureCancelledError:
                    codes.add(grpc.StatusCode.CANCELLED)
                except grpc.RpcError as e:
                    codes.add(e.code())
            self.assertEqual(codes, {grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED})

    def watch_streams(self):
        call, request, _ = self.cluster.client.stub("ddp.v1.Coordinator/WatchStatus")
        watches = [call(request(interval_seconds=0.5)) for _ in range(64)]
        for w in watches:
            next(w)  # each got its first snapshot
        extra = call(request())
        with self.assertRaises(grpc.RpcError) as e:
            next(extra)
        self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("--max_watch_streams 64", e.exception.details())
        for w in watches:
            w.cancel()
        again = []
        wait_for(lambda: again.append(call(request())) or next(again[-1]), 10,
                 "a watch once the others left")
        for w in again:
            w.cancel()

    def silent_attach_streams(self):
        """Streams that never register: the ones over the limit are refused at
        once, the others closed at the register deadline."""
        open_now = 2  # the real workers
        streams = [Stream(self.cluster) for _ in range(MAX_ATTACH_STREAMS + 4)]
        codes = [s.finished(timeout=30) for s in streams]
        refused = [d for c, d in codes if c == grpc.StatusCode.RESOURCE_EXHAUSTED]
        late = [d for c, d in codes if c == grpc.StatusCode.DEADLINE_EXCEEDED]
        self.assertEqual(len(refused), 4 + open_now, codes)
        self.assertEqual(len(late), MAX_ATTACH_STREAMS - open_now, codes)
        self.assertIn("--max_attach_streams %d" % MAX_ATTACH_STREAMS, refused[0])
        self.assertIn("RegisterRequest", late[0])
        for s in streams:
            s.end()

    def garbage_on_attach(self):
        for garbage in [b"\xff\xff\xff\xff\xff", b"\x0a\x04\x0a\x02\xc3\x28"]:  # bad UTF-8
            # The silent streams just closed may still count against the
            # stream limit for a moment: until they are released, a new
            # stream is refused as one too many.
            deadline = time.time() + 10
            while True:
                s = Stream(self.cluster, raw=True)
                s.send(garbage)
                code, details = s.finished()
                if code != grpc.StatusCode.RESOURCE_EXHAUSTED or time.time() > deadline:
                    break
                s.end()
                time.sleep(0.1)
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, details)
            self.assertIn("not a ddp.v1.WorkerMessage", details)
            s.end()
        s = Stream(self.cluster)  # hung up at once: that is not garbage
        s.end()
        self.assertEqual(s.finished()[0], grpc.StatusCode.OK)

    def worker_that_never_reads(self):
        # Its own connection, without BDP probing: its receive window stays
        # at 64 KiB, so what it does not read backs up in the coordinator,
        # not in this client's buffers (which grow to megabytes otherwise).
        channel = grpc.insecure_channel(self.cluster.target,
                                        options=[("grpc.http2.bdp_probe", 0)])
        # With the worker token the coordinator made for this user.
        with open(local_token_file(self.cluster.target, "worker")) as f:
            channel = grpc.intercept_channel(
                channel, _Metadata([("authorization", "Bearer " + f.read().strip())]))
        slow = Stream(self.cluster, read=False, channel=channel)
        slow.send(self.register(name="slow"))
        wait_for(lambda: any(w["worker_id"] == "slow" for w in self.cluster.status()["workers"]),
                 20, "the slow worker to attach")
        stale = self.cluster.client.message("ddp.v1.WorkerMessage", {
            "state": {"generation": 999, "state": "WORKER_STATE_TRAINING"}}).SerializeToString()
        for _ in range(5000):  # each answered with a Rejected it never reads; ~1,700 fill it
            slow.requests.put(stale)
        lost = wait_for(lambda: next((w for w in self.cluster.status()["workers"]
                                      if w["worker_id"] == "slow" and
                                      w["state"] == "WORKER_STATE_LOST"), None),
                        60, "the slow worker to be cut off")
        self.assertIn("did not read its stream", lost["detail"])
        # Its last write never completes, so the call is cancelled: the
        # RESOURCE_EXHAUSTED status can't overtake the messages before it.
        code, _ = slow.finished(timeout=60)
        self.assertIn(code, [grpc.StatusCode.CANCELLED, grpc.StatusCode.RESOURCE_EXHAUSTED])
        slow.end()
        channel.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
