#!/usr/bin/python3
"""The coordinator unit's own restart path, mid-training: the command line is
the unit's ExecStart with its environment file's variables expanded (as
systemd expands them), and the restarts are the unit's: after a crash
(kill -9; Restart=on-failure, RestartSec) and `systemctl restart` (SIGTERM,
then start). Workers train on through both; the restarted coordinator adopts
their generation (no new generation, no step lost), and the unit's --job
naming the job it already holds is a no-op, not a crash loop."""
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "py"))
import chaos  # noqa: E402
from chaos import ChaosRun, chaos_job  # noqa: E402
from harness import BIN, free_port, wait_for  # noqa: E402

UNITS = os.path.join(HERE, "..", "..", "deploy", "systemd")


def unit_settings(unit):
    settings = {}
    with open(os.path.join(UNITS, unit)) as f:
        for line in f:
            m = re.match(r"^(\w+)=(.*)$", line.strip())
            if m:
                settings[m.group(1)] = m.group(2)
    return settings


def env_file(name):
    env = {}
    with open(os.path.join(UNITS, name)) as f:
        for line in f:
            m = re.match(r"^(\w+)=(.*)$", line.strip())
            if m:
                env[m.group(1)] = m.group(2)
    return env


def expand_exec_start(command, env):
    """systemd's rules: ${VAR} is one word, $VAR splits on whitespace."""
    words = []
    for word in shlex.split(command):
        if re.fullmatch(r"\$\w+", word):
            words.extend(env.get(word[1:], "").split())
        else:
            words.append(re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), word))
    return words


class UnitRestartTest(unittest.TestCase):
    def test_restarts_the_unit_way_mid_training(self):
        unit = unit_settings("ddp-coordinator.service")
        self.assertEqual(unit["Restart"], "on-failure")
        restart_sec = float(unit["RestartSec"].rstrip("s"))
        state = tempfile.mkdtemp(prefix="ddp-unit-state-")
        job = chaos_job("unit-restart", epochs=16)
        port = free_port()
        run = ChaosRun(job, workers=0)  # its own coordinator is replaced below
        self.addCleanup(run.close)
        run.kill("coordinator")
        env = env_file("ddp-coordinator.env")
        # What an operator sets: the address, the state folder, the job file.
        env.update(DDP_LISTEN="127.0.0.1:%d" % port, DDP_STATE_DIR=state,
                   DDP_COORDINATOR_FLAGS="--job=%s --heartbeat_timeout=2s --heartbeat_interval=0.5s"
                   % os.path.join(run.dir, "job.json"))
        argv = expand_exec_start(unit["ExecStart"], env)
        self.assertEqual(os.path.basename(argv[0]), "ddp-coordinator")
        argv[0] = os.path.join(BIN, "ddp-coordinator")
        run.coordinator_args = argv
        run.target = "127.0.0.1:%d" % port
        run.start_coordinator()
        for i in range(3):
            run.start_worker(i)
        run.wait_state("JOB_STATE_RUNNING", 60)
        run.wait_step_past(100)
        generation = run.generation()

        # A crash: systemd starts it again RestartSec later.
        run.kill("coordinator")
        step_at_crash = max(m["step"] for m in run.metrics("w0"))
        time.sleep(restart_sec)
        run.start_coordinator()
        adopted = lambda n: sum(c["cause"] == "CHANGE_CAUSE_ADOPTED"  # noqa: E731
                                for c in run.status().get("generation_changes", [])) >= n
        wait_for(lambda: adopted(1), 30, "the restarted coordinator to adopt the generation")
        self.assertEqual(run.generation(), generation)
        self.assertGreater(max(m["step"] for m in run.metrics("w0")), step_at_crash,
                           "training stopped while the coordinator was down")

        # systemctl restart: SIGTERM, then the same command again.
        run.signal("coordinator", signal.SIGTERM)
        self.assertEqual(run.procs["coordinator"].wait(timeout=30), 0)
        run.start_coordinator()
        wait_for(lambda: adopted(2), 30, "the coordinator to adopt the generation again")
        self.assertEqual(run.generation(), generation)

        final = run.finish()
        self.assertEqual(final["state"], "JOB_STATE_SUCCEEDED", final.get("message"))
        self.assertEqual(int(final["generation"]), generation)  # never re-formed
        causes = [c["cause"] for c in final["generation_changes"]]
        self.assertEqual(causes, ["CHANGE_CAUSE_START", "CHANGE_CAUSE_ADOPTED",
                                  "CHANGE_CAUSE_ADOPTED"])
        chaos.coverage.check(run.index_lines(), chaos.FASHION_MNIST_TRAIN, job["epochs"])
        run.close()
        self.assertEqual(run.crashed(), [])
        self.assertEqual(run.leftovers(), ([], []))


if __name__ == "__main__":
    unittest.main(verbosity=2)
