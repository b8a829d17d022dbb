#!/usr/bin/python3
"""Coordinators that fail over through a real 3-member etcd, faults caused
for real: the leader killed (kill -9), the leader paused (SIGSTOP) past its
lease, an etcd member killed, and all of etcd down for 10 s. Training never
waits for a coordinator; every run ends with every sample trained once per
epoch and a check of etcd's revision history that no two leadership terms
overlap in their writes."""
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "py"))
import grpc  # noqa: E402

import coverage  # noqa: E402
import faults  # noqa: E402
from chaos import FASHION_MNIST_TRAIN, chaos_job  # noqa: E402
from etcd_cluster import EtcdCluster  # noqa: E402
from failover import FailoverRun, check_terms, etcd_history  # noqa: E402
from grpc_reflect import ReflectionClient  # noqa: E402
from harness import BIN, free_port, read_text, wait_for  # noqa: E402

TTL = 2  # seconds: the default --lease_ttl
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))


class FailoverTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.etcd = EtcdCluster(3)

    @classmethod
    def tearDownClass(cls):
        cls.etcd.close()

    def run_job(self, name, epochs=3, coordinators=2):
        job = chaos_job(name, epochs=epochs)
        run = FailoverRun(job, self.etcd, coordinators=coordinators, lease_ttl=TTL)
        self.addCleanup(run.close)
        run.wait_state("JOB_STATE_RUNNING", 60)
        run.wait_step_past(40)
        return run

    def finish(self, run, since):
        """The checks every run ends with: success, every sample once, no
        step lost, no step gap over a second after `since`, and the terms."""
        final = run.finish(240)
        self.assertEqual(final["state"], "JOB_STATE_SUCCEEDED", final.get("message"))
        coverage.check(run.index_lines(), FASHION_MNIST_TRAIN, int(run.job["epochs"]))
        for change in final.get("generation_changes", []):
            self.assertEqual(int(change.get("steps_lost", 0)), 0, change)
        gap = longest_step_gap(run, since)
        print("longest gap between steps after the fault: %.3fs" % gap, flush=True)
        self.assertLess(gap, 1.0)
        terms, problems = check_terms(etcd_history(self.etcd.endpoints, run.prefix), run.prefix)
        print("terms (lease, first write, last write, writes): %s" % terms, flush=True)
        self.assertEqual(problems, [])
        self.assertGreaterEqual(len(terms), 2, "a second term wrote")
        run.close()
        self.assertEqual(run.crashed(), [], "processes that crashed")
        return final

    def test_leader_killed_a_standby_leads_within_the_ttl_training_never_waits(self):
        run = self.run_job("failover-kill")
        leader = run.leader()
        other = 1 - leader
        t = time.time()
        run.kill("c%d" % leader)
        took = run.wait_leader(other, TTL + 5) - t
        print("c%d killed; c%d led %.2fs later" % (leader, other, took), flush=True)
        self.assertLess(took, TTL + 1.0)
        # Back as a standby: it names the new leader, is alive but does not
        # serve the API (health), and relays a watch from the leader.
        run.start_one(leader)
        run.wait_refusal_naming(leader, run.addresses[other])
        self.assertEqual(run.health(leader), "SERVING")
        self.assertEqual(run.health(leader, "ddp.v1.Coordinator"), "NOT_SERVING")
        self.assertEqual(run.health(other, "ddp.v1.Coordinator"), "SERVING")
        watched = run.watch_through(leader)
        self.assertEqual(len(watched), 2)
        self.assertEqual(watched[0].get("job_id"), run.job["name"])
        final = self.finish(run, t)
        # The members were adopted: no new generation for the takeover.
        for change in final.get("generation_changes", []):
            if float(change.get("at_unix_seconds", 0)) > t:
                self.assertEqual(change.get("cause"), "CHANGE_CAUSE_ADOPTED", change)
                self.assertEqual(change.get("from_generation"), change.get("to_generation"))

    def test_leader_paused_past_its_lease_is_deposed_and_comes_back_a_standby(self):
        run = self.run_job("failover-stop")
        leader = run.leader()
        other = 1 - leader
        t = time.time()
        run.signal("c%d" % leader, signal.SIGSTOP)
        took = run.wait_leader(other, TTL + 5) - t
        print("c%d stopped; c%d led %.2fs later" % (leader, other, took), flush=True)
        self.assertLess(took, TTL + 1.0)
        time.sleep(max(0.0, t + 3 * TTL - time.time()))
        run.signal("c%d" % leader, signal.SIGCONT)
        # It notices at once that it lost, and starts over as a standby.
        run.wait_refusal_naming(leader, run.addresses[other])
        self.finish(run, t)

    def test_etcd_member_lost_then_all_etcd_down_training_goes_on(self):
        # Long enough to train through ~15 s of faults on a fast machine too
        # (4 epochs ended before etcd went down on one).
        run = self.run_job("failover-etcd", epochs=10)
        leader = run.leader()
        # One member of three: nothing to see.
        self.etcd.kill(2)
        time.sleep(2 * TTL)
        self.assertEqual(run.leader(), leader)
        own = run.leadership_of(leader)
        self.assertTrue(own and own.get("is_leader"), own)
        self.etcd.restart(2)
        # All of etcd: no coordinator may lead, workers train on.
        step = run.step()
        t = time.time()
        for i in range(3):
            self.etcd.stop(i)
        try:
            # The leader stops leading (it can't renew) and starts over; each
            # coordinator refuses, saying etcd can't be reached.
            for i in range(len(run.addresses)):
                wait_for(lambda: "etcd can't be reached" in run.refusal(i)[1], 3 * TTL,
                         "c%d to say etcd can't be reached" % i, interval=0.1)
            time.sleep(max(0.0, t + 10 - time.time()))
            trained = max(m["step"] for m in run.metrics("w0"))
            self.assertGreater(trained, step + 50, "training went on while etcd was down")
        finally:
            for i in range(3):
                self.etcd.cont(i)
        self.finish(run, t)


def etcdctl(endpoint, *args, user=None, check=False):
    """etcdctl (v3) against `endpoint`, as `user` ("NAME:PASSWORD") if given."""
    creds = ["--user=" + user] if user else []
    return subprocess.run(["etcdctl", "--endpoints=" + endpoint] + creds + list(args),
                          check=check, capture_output=True, text=True, timeout=20,
                          env=dict(os.environ, ETCDCTL_API="3"))


def start_coordinator(flags):
    """A ddp-coordinator on a free loopback port with `flags` (its etcd
    settings), its output in a log of its own: (process, log path, command
    line, port). The caller stops it."""
    folder = tempfile.mkdtemp(prefix="ddp-failover-start-")
    port = free_port()
    log_path = os.path.join(folder, "c0.log")
    argv = [os.path.join(BIN, "ddp-coordinator"), "--listen=127.0.0.1:%d" % port,
            "--metrics_listen=", "--http_listen=", "--allow_anonymous_loopback"] + list(flags)
    with open(log_path, "w") as log:
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return p, log_path, argv, port


class FailoverStartTest(unittest.TestCase):
    def test_etcd_unreachable_at_start_said_and_retried_then_leads(self):
        with EtcdCluster(1) as etcd:
            etcd.stop(0)
            p, log_path, _, port = start_coordinator(
                ["--etcd_endpoints=" + ",".join(etcd.endpoints)])
            try:
                wait_for(lambda: "unreachable" in (read_text(log_path) or ""), 10,
                         "the coordinator to say etcd is unreachable")
                client = ReflectionClient("127.0.0.1:%d" % port)
                try:
                    client.call("ddp.v1.Coordinator/CancelJob", '{"job_id": "x"}', timeout=2)
                    self.fail("a coordinator without etcd accepted a mutation")
                except grpc.RpcError as e:
                    self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE)
                    self.assertIn("etcd can't be reached", e.details())
                client.close()
                etcd.cont(0)
                wait_for(lambda: "leading: " in (read_text(log_path) or ""), 15,
                         "the coordinator to lead once etcd is back")
                self.assertIsNone(p.poll())
            finally:
                p.terminate()
                p.wait(timeout=10)

    def test_state_someone_else_wrote_is_refused_and_the_coordinator_stays_up(self):
        # A local user with etcd's auth off writes a job into the state: the
        # coordinator elected refuses to lead on it (it is not sealed with
        # the coordinators' key), says so naming the key, stays up as a
        # standby and stands again; once the key is removed it leads.
        with EtcdCluster(1) as etcd:
            endpoint = etcd.endpoints[0]
            etcdctl(endpoint, "put", "/ddp/forged/format", "ddp-coordinator-state 2", check=True)
            etcdctl(endpoint, "put", "/ddp/forged/state", '{"job": {"name": "injected"}}',
                    check=True)
            p, log_path, _, port = start_coordinator(
                ["--etcd_endpoints=" + endpoint, "--etcd_prefix=/ddp/forged"])
            try:
                wait_for(lambda: (read_text(log_path) or "").count("refusing to lead") >= 2, 30,
                         "the coordinator to refuse to lead, twice")
                text = read_text(log_path)
                self.assertIn("etcd key /ddp/forged/state is not sealed by a coordinator", text)
                self.assertIn("etcdctl del /ddp/forged/state", text)
                self.assertNotIn("leading: restored", text)
                self.assertIsNone(p.poll(), text[-2000:])
                client = ReflectionClient("127.0.0.1:%d" % port)
                health = client.call("grpc.health.v1.Health/Check",
                                     '{"service": "ddp.v1.Coordinator"}', timeout=5)
                self.assertEqual(health.get("status"), "NOT_SERVING")
                client.close()
                etcdctl(endpoint, "del", "/ddp/forged/state", check=True)
                def serving():
                    c = ReflectionClient("127.0.0.1:%d" % port)
                    try:
                        return c.call("grpc.health.v1.Health/Check",
                                      '{"service": "ddp.v1.Coordinator"}',
                                      timeout=2).get("status") == "SERVING"
                    except grpc.RpcError:
                        return False
                    finally:
                        c.close()
                wait_for(serving, 30, "the coordinator to lead once the forged state is gone")
                self.assertIsNone(p.poll())
            finally:
                p.terminate()
                p.wait(timeout=10)

    def test_etcd_with_its_users_and_roles_on_the_coordinator_authenticates(self):
        # etcd's RBAC as docs/SECURITY.md sets it up: a user with a role on
        # /ddp/ only, auth enabled. The coordinator leads with that user's
        # password; a client without credentials (any local user) can no
        # longer read or write the state; a wrong password is refused at
        # start, naming the user.
        with EtcdCluster(1) as etcd:
            endpoint = etcd.endpoints[0]
            folder = tempfile.mkdtemp(prefix="ddp-etcd-auth-")
            for args in (["user", "add", "root", "--new-user-password=root-secret-1"],
                         ["user", "grant-role", "root", "root"],
                         ["role", "add", "ddp"],
                         ["role", "grant-permission", "ddp", "--prefix=true", "readwrite",
                          "/ddp/"],
                         ["user", "add", "ddp", "--new-user-password=ddp-secret-0123456789"],
                         ["user", "grant-role", "ddp", "ddp"],
                         ["auth", "enable"]):
                done = etcdctl(endpoint, *args)
                self.assertTrue(done.returncode == 0 or "already" in done.stderr,
                                (args, done.stderr))
            password = os.path.join(folder, "etcd-password")
            with open(password, "w") as f:
                f.write("ddp-secret-0123456789\n")
            os.chmod(password, 0o600)
            p, log_path, argv, _ = start_coordinator(
                ["--etcd_endpoints=" + endpoint, "--etcd_user=ddp",
                 "--etcd_password_file=" + password])
            try:
                wait_for(lambda: "leading: " in (read_text(log_path) or ""), 30,
                         "the coordinator to lead as etcd's user ddp")
                anonymous = etcdctl(endpoint, "get", "--prefix", "/ddp/")
                self.assertNotEqual(anonymous.returncode, 0, anonymous.stdout)
                as_ddp = etcdctl(endpoint, "get", "--prefix", "--keys-only", "/ddp/",
                                 user="ddp:ddp-secret-0123456789")
                self.assertIn("/ddp/default/format", as_ddp.stdout, as_ddp.stderr)
                self.assertIsNone(p.poll())
            finally:
                p.terminate()
                p.wait(timeout=10)
            with open(password, "w") as f:
                f.write("not-the-password\n")
            wrong = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            self.assertEqual(wrong.returncode, 2, wrong.stdout + wrong.stderr)
            self.assertIn("authenticating to etcd as ddp", wrong.stdout + wrong.stderr)
            self.assertNotIn("not-the-password", wrong.stdout + wrong.stderr)
            os.chmod(password, 0o644)
            readable = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            self.assertEqual(readable.returncode, 2, readable.stdout + readable.stderr)
            self.assertIn("--etcd_password_file", readable.stdout + readable.stderr)

    def test_tls_etcd_made_as_deploy_shows_the_coordinator_leads_over_it(self):
        # deploy/etcd/make-certs.sh's certificates, etcd started with them as
        # docs/SECURITY.md says (TLS, client certificates required): the
        # coordinator leads with its client certificate; a client without
        # one is refused by etcd.
        folder = tempfile.mkdtemp(prefix="ddp-etcd-tls-")
        certs = os.path.join(folder, "certs")
        subprocess.run([os.path.join(REPO, "deploy/etcd/make-certs.sh"), certs,
                        "127.0.0.1,localhost"], check=True, capture_output=True, timeout=60)
        client_port, peer_port = free_port(), free_port()
        peer = "http://127.0.0.1:%d" % peer_port
        etcd = subprocess.Popen(
            ["etcd", "--name=m0", "--data-dir=" + os.path.join(folder, "data"),
             "--listen-client-urls=https://127.0.0.1:%d" % client_port,
             "--advertise-client-urls=https://127.0.0.1:%d" % client_port,
             "--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
             "--initial-cluster=m0=" + peer,
             "--cert-file=" + os.path.join(certs, "server.pem"),
             "--key-file=" + os.path.join(certs, "server-key.pem"),
             "--client-cert-auth", "--trusted-ca-file=" + os.path.join(certs, "ca.pem")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        p = None
        try:
            p, log_path, _, _ = start_coordinator(
                ["--etcd_endpoints=127.0.0.1:%d" % client_port,
                 "--etcd_tls_ca=" + os.path.join(certs, "ca.pem"),
                 "--etcd_tls_cert=" + os.path.join(certs, "ddp.pem"),
                 "--etcd_tls_key=" + os.path.join(certs, "ddp-key.pem")])
            wait_for(lambda: "leading: " in (read_text(log_path) or ""), 30,
                     "the coordinator to lead over TLS etcd")
            no_cert = etcdctl("https://127.0.0.1:%d" % client_port,
                              "--cacert=" + os.path.join(certs, "ca.pem"), "--dial-timeout=1s",
                              "--command-timeout=2s", "get", "--prefix", "/ddp/")
            self.assertNotEqual(no_cert.returncode, 0, no_cert.stdout)
            self.assertIsNone(p.poll())
        finally:
            for proc in (p, etcd):
                if proc is not None:
                    proc.terminate()
                    proc.wait(timeout=10)


class FailoverFlagsTest(unittest.TestCase):
    def test_settings_that_cannot_work_exit_2_naming_the_flag(self):
        coordinator = os.path.join(BIN, "ddp-coordinator")
        cases = [
            (["--etcd_endpoints=127.0.0.1:2379", "--state_dir=/tmp/x"], "--state_dir"),
            (["--etcd_endpoints=http://127.0.0.1:2379"], "--etcd_endpoints"),
            (["--etcd_endpoints=127.0.0.1:2379", "--etcd_prefix=ddp"], "--etcd_prefix"),
            (["--etcd_endpoints=127.0.0.1:2379", "--etcd_prefix=/ddp/"], "--etcd_prefix"),
            (["--etcd_endpoints=127.0.0.1:2379", "--lease_ttl=1500ms"], "--lease_ttl"),
            (["--etcd_endpoints=127.0.0.1:2379", "--lease_ttl=0s"], "--lease_ttl"),
            (["--etcd_endpoints=127.0.0.1:2379", "--advertise_address=nohost"],
             "--advertise_address"),
            (["--etcd_endpoints=127.0.0.1:2379", "--listen=0.0.0.0:0", "--insecure"],
             "--advertise_address"),
            # etcd off loopback in plaintext: refused as the listeners are.
            (["--etcd_endpoints=10.0.0.7:2379"], "--etcd_tls_ca"),
            (["--etcd_endpoints=127.0.0.1:2379", "--state_key_file=/nonexistent/key"],
             "--state_key_file"),
        ]
        for flags, named in cases:
            out = subprocess.run([coordinator, "--metrics_listen=", "--http_listen=",
                                  "--allow_anonymous_loopback"] + flags,
                                 capture_output=True, text=True, timeout=20)
            self.assertEqual(out.returncode, 2, (flags, out.stdout + out.stderr))
            self.assertIn(named, out.stdout + out.stderr, flags)


def longest_step_gap(run, since):
    """The longest gap between consecutive completed steps of one worker
    after `since`, within an epoch and a generation (an epoch's end has
    its evaluation)."""
    rec = faults.Records(run)
    longest = 0.0
    for lines in rec.step_times().values():
        for (t1, _, e1, g1), (t2, _, e2, g2) in zip(lines, lines[1:]):
            if t2 >= since and e1 == e2 and g1 == g2:
                longest = max(longest, t2 - t1)
    return longest


if __name__ == "__main__":
    unittest.main()
