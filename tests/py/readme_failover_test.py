#!/usr/bin/python3
"""README's "Coordinators that fail over" block, run as written (only the
binaries' folder put first on PATH): three etcd members, two coordinators,
two workers; the job trains, the leader is killed with -9, the other takes
over and the job succeeds. A README example that fails when followed
literally is a broken front door."""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import grpc

sys.path.insert(0, os.path.dirname(__file__))
from grpc_reflect import ReflectionClient  # noqa: E402
from harness import BIN, wait_for  # noqa: E402

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
PORTS = (29400, 29401)


def coordinator_pid(port):
    """The ddp-coordinator listening on `port`, by its command line (/proc)."""
    wanted = ["--listen", "127.0.0.1:%d" % port]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if args and args[0].endswith("ddp-coordinator") and any(
                args[i:i + 2] == wanted for i in range(len(args))):
            return int(entry)
    raise AssertionError("no ddp-coordinator listens on port %d" % port)


def failover_block():
    with open(README) as f:
        text = f.read()
    found = re.search(r"```sh\n(# etcd: three members.*?)```", text, re.S)
    if found is None:
        raise AssertionError("README has no failover block starting '# etcd: three members'")
    return found.group(1)


class ReadmeFailoverTest(unittest.TestCase):
    def setUp(self):
        if shutil.which("etcd") is None:
            self.skipTest("etcd is not installed (deploy/setup.sh installs etcd-server)")
        for port in PORTS + (20379, 21379, 22379):
            with __import__("socket").socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    self.skipTest("port %d is taken here: the block uses fixed ports" % port)
        self.dir = tempfile.mkdtemp(prefix="ddp-readme-failover-")
        env = dict(os.environ, PATH=BIN + ":" + os.environ.get("PATH", "/usr/bin:/bin"))
        # Its own process group: every process the block starts goes with it.
        self.block = subprocess.Popen(["bash", "-c", failover_block() + "\nwait\n"], cwd=self.dir,
                                      env=env, start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.clients = {port: ReflectionClient("127.0.0.1:%d" % port, local_token=False)
                        for port in PORTS}

    def tearDown(self):
        for client in self.clients.values():
            client.close()
        try:
            os.killpg(self.block.pid, signal.SIGTERM)
            self.block.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.block.pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self):
        out = []
        for name in sorted(os.listdir(self.dir)):
            if name.endswith(".log"):
                with open(os.path.join(self.dir, name)) as f:
                    out.append("--- %s\n%s" % (name, f.read()[-1500:]))
        return "\n".join(out)

    def status(self):
        """GetStatus from whichever coordinator answers (a standby forwards)."""
        for port in PORTS:
            try:
                return self.clients[port].call("ddp.v1.Coordinator/GetStatus", timeout=2)
            except grpc.RpcError:
                continue
        return None

    def wait(self, predicate, timeout, what):
        try:
            return wait_for(predicate, timeout, what, interval=0.2)
        except AssertionError as e:
            raise AssertionError("%s\n%s" % (e, self.logs())) from None

    def test_the_block_trains_and_survives_a_killed_leader(self):
        training = self.wait(lambda: (lambda s: s if s and s.get("state") == "JOB_STATE_RUNNING"
                                      and int(s.get("global_step", 0)) > 20 else None)(
                                          self.status()), 180, "the README's job to train")
        leader = training["leadership"]["leader"]
        port = int(leader.rsplit(":", 1)[1])
        pid = coordinator_pid(port)
        step = int(training["global_step"])
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        other = [p for p in PORTS if p != port][0]
        self.wait(lambda: (lambda s: s and s.get("leadership", {}).get("leader") ==
                           "127.0.0.1:%d" % other)(self.status()), 30, "the other to lead")
        print("leader killed; the other led %.2fs later" % (time.time() - killed), flush=True)
        final = self.wait(lambda: (lambda s: s if s and s.get("state") in (
            "JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED") else None)(self.status()), 240,
            "the job to end")
        self.assertEqual(final["state"], "JOB_STATE_SUCCEEDED", final.get("message"))
        self.assertGreater(int(final["global_step"]), step)


if __name__ == "__main__":
    unittest.main()
