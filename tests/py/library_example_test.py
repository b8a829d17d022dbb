#!/usr/bin/python3
"""A user's program on the installed library, from outside the tree: `cmake
--install` into a temporary prefix, examples/custom_loop configured with
find_package(ddp) against that prefix and built, then run two-way under the
installed ddp-run (loss falls, accuracy printed, the job succeeds), joined by
hand to a coordinator (DDP_COORDINATOR: the coordinator sees every step; a
killed rank ends the other at once with the coordinator's reason; training
goes on through a coordinator killed and restarted; TLS, tokens and the
refusals), and
started as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Also
what ddp-run hands a program, and that one failing rank stops the others."""
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from certs import Pki  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../chaos"))
import coverage  # noqa: E402
from cluster import Cluster, rank_of_ddp_run, synthetic_job  # noqa: E402
from harness import BIN, free_port, read_text, thread_env, wait_for  # noqa: E402

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../..")
BUILD = os.environ.get("DDP_BUILD_DIR", os.path.join(REPO, "build"))
EPOCHS_THROUGH_RESTART = 1000  # the coordinator-restart case: 64 steps an epoch


def kill_when_found(proc, find_victim, what, timeout):
    """SIGKILLs the pid find_victim returns (polled for up to 120 s), then
    waits for `proc`; returns its (stdout, stderr). `proc` is killed if it
    outlives the test."""
    try:
        os.kill(wait_for(find_victim, 120, what), signal.SIGKILL)
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def run(cmd, timeout, **kwargs):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    if done.returncode != 0:
        raise AssertionError("%s exited with %d:\n%s%s" % (
            " ".join(cmd), done.returncode, done.stdout[-3000:], done.stderr[-3000:]))
    return done.stdout


class DdpRunProgramTest(unittest.TestCase):
    def test_each_copy_gets_the_coordinator_and_a_share_of_the_cores(self):
        # The copies print what they got and leave without joining: the job
        # never ends, which ddp-run says instead of waiting for ever.
        done = subprocess.run(
            [os.path.join(BIN, "ddp-run"), "--nproc=3", "--threads=2", "--",
             "sh", "-c", "echo coordinator=$DDP_COORDINATOR local=$LOCAL_RANK/$LOCAL_WORLD_SIZE "
             "omp=$OMP_NUM_THREADS"], capture_output=True, text=True, timeout=60)
        lines = sorted(l for l in done.stdout.splitlines() if l.startswith("coordinator="))
        self.assertEqual(len(lines), 3, done.stdout + done.stderr)
        targets = set()
        for index, line in enumerate(lines):
            m = re.match(r"coordinator=(127\.0\.0\.1:\d+) local=(\d)/3 omp=2$", line)
            self.assertIsNotNone(m, line)
            self.assertEqual(int(m.group(2)), index)
            targets.add(m.group(1))
        self.assertEqual(len(targets), 1)
        self.assertIn("joined to the coordinator at " + targets.pop(), done.stdout)
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
        self.assertIn("every rank exited, but the job did not end", done.stderr)

    def test_a_failing_rank_stops_the_others_and_gives_its_code(self):
        started = time.time()
        done = subprocess.run(
            [os.path.join(BIN, "ddp-run"), "--nproc=2", "--",
             "sh", "-c", 'if [ "$LOCAL_RANK" = 1 ]; then exit 3; fi; sleep 60'],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(done.returncode, 3, done.stdout + done.stderr)
        self.assertLess(time.time() - started, 30)
        self.assertIn("rank 1 exited with code 3", done.stderr)

    def test_job_and_program_together_refused(self):
        done = subprocess.run([os.path.join(BIN, "ddp-run"), "--job=x.json", "--", "true"],
                              capture_output=True, text=True, timeout=30)
        self.assertEqual(done.returncode, 2)
        self.assertIn("can't be given together", done.stderr)


@unittest.skipUnless(os.path.exists(os.path.join(BUILD, "CMakeCache.txt")),
                     "no build folder at " + BUILD)
class OutOfTreeExampleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ddp-example-")
        cls.prefix = os.path.join(cls.dir, "prefix")
        run(["cmake", "--install", BUILD, "--prefix", cls.prefix], timeout=300)
        build = os.path.join(cls.dir, "build")
        run(["cmake", "-S", os.path.join(REPO, "examples/custom_loop"), "-B", build, "-G", "Ninja",
             "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_PREFIX_PATH=" + cls.prefix], timeout=300)
        run(["cmake", "--build", build], timeout=900)
        cls.program = os.path.join(build, "custom_loop")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def check_trained(self, out):
        losses = [float(x) for x in re.findall(r"^epoch \d+ loss ([0-9.]+)", out, re.M)]
        self.assertGreaterEqual(len(losses), 2, out)
        self.assertLess(losses[-1], losses[0] * 0.8, out)
        accuracy = float(re.search(r"^accuracy ([0-9.]+)", out, re.M).group(1))
        self.assertGreater(accuracy, 0.8, out)
        return accuracy

    def test_installed_package_has_headers_library_and_config(self):
        for path in ("include/ddp/ddp.h", "include/ddp/version.h", "lib/cmake/ddp/ddpConfig.cmake",
                     "lib/cmake/ddp/ddpConfigVersion.cmake", "bin/ddp-run"):
            self.assertTrue(os.path.exists(os.path.join(self.prefix, path)), path)
        headers = os.listdir(os.path.join(self.prefix, "include/ddp"))
        for header in headers:
            with open(os.path.join(self.prefix, "include/ddp", header)) as f:
                text = f.read()
            self.assertNotIn("grpc", text, header)
            self.assertNotIn(".pb.h", text, header)

    def test_runs_two_way_under_the_installed_ddp_run(self):
        out = run([os.path.join(self.prefix, "bin/ddp-run"), "--nproc=2", "--", self.program,
                   "--data", os.path.join(self.dir, "data-run"), "--epochs", "20"], timeout=300)
        print("under ddp-run: accuracy %.3f" % self.check_trained(out))
        # 4096 samples, 2 ranks, batches of 32: 64 steps an epoch.
        self.assertIn("job program SUCCEEDED", out)
        self.assertIn("finished 1280 steps", out)

    def test_under_ddp_run_a_killed_rank_is_restarted_and_takes_up_the_state(self):
        # Killed once both ranks have trained two epochs (their index log
        # says so; a fixed sleep after rank 1's start could land before the
        # first generation under load, when there is no state to take up):
        # rank 0 waits for the restarted copy (no --min_nproc), so the kill
        # can't come after the job's end, and a short job is enough.
        index_log = os.path.join(self.dir, "restarted.idx.jsonl")
        proc = subprocess.Popen(
            [os.path.join(self.prefix, "bin/ddp-run"), "--nproc=2", "--max_restarts=1", "--",
             self.program, "--data", os.path.join(self.dir, "data-restarted"), "--epochs", "40"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=thread_env(DDP_INDEX_LOG=index_log))
        def training():
            if '"epoch": 2,' not in (read_text(index_log) or ""):
                return None
            return rank_of_ddp_run(proc.pid, 1, "custom_loop")
        out, err = kill_when_found(proc, training, "epoch 2 to be under way", 300)
        self.assertEqual(proc.returncode, 0, out + err)
        self.assertIn("rank 1 exited with code 137; restarting it (0 restart(s) left)", err)
        self.assertRegex(err, r"took up rank 0's state at step \d+")
        self.assertIn("job program SUCCEEDED", out)
        self.check_trained(out)

    def test_under_ddp_run_a_killed_and_restarted_rank_loses_no_sample(self):
        # The library's re-formations held to the daemon's coverage rule
        # (tests/chaos/coverage.py over DDP_INDEX_LOG, as over ddp-worker's
        # --index_log): through a kill -9 of rank 1 mid-epoch and its
        # restart, every epoch trains every sample once (up to the sampler's
        # padding) in committed steps.
        index_log = os.path.join(self.dir, "coverage.idx.jsonl")
        epochs = 40
        proc = subprocess.Popen(
            [os.path.join(self.prefix, "bin/ddp-run"), "--nproc=2", "--max_restarts=1", "--",
             self.program, "--data", os.path.join(self.dir, "data-coverage"), "--epochs",
             str(epochs)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=thread_env(DDP_INDEX_LOG=index_log))
        def mid_epoch_three():
            if (read_text(index_log) or "").count('"epoch": 3,') < 20:
                return None
            return rank_of_ddp_run(proc.pid, 1, "custom_loop")
        out, err = kill_when_found(proc, mid_epoch_three, "epoch 3 to be under way", 300)
        self.assertEqual(proc.returncode, 0, out + err)
        self.assertIn("rank 1 exited with code 137; restarting it", err)
        lines = coverage.read_lines(index_log)
        # Both ranks are needed (no --min_nproc): generation 2 forms once the
        # restarted copy is back, from the survivor's state.
        self.assertGreaterEqual(len({l["generation"] for l in lines}), 2, "it re-formed")
        coverage.check(lines, 4096, epochs)

    def test_under_ddp_run_a_rank_killed_in_an_epochs_last_step_loses_no_sample(self):
        # One batch an epoch, so the kill -9 lands in (or just after) an
        # epoch's last step. The survivor's dropped step is trained again
        # inside the same pass, before its end-of-epoch all-reduce, where the
        # restarted rank starts too. (Re-forming only at the next pass's
        # first batch trained that epoch's rest in the next epoch's loop:
        # replicas diverged on the learning rate, or "collectives are
        # misaligned" at the all-reduce; seen in CI.)
        index_log = os.path.join(self.dir, "last-step.idx.jsonl")
        epochs = 200
        proc = subprocess.Popen(
            [os.path.join(self.prefix, "bin/ddp-run"), "--nproc=2", "--max_restarts=1", "--",
             self.program, "--data", os.path.join(self.dir, "data-last-step"), "--epochs",
             str(epochs), "--batch", "2048"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=thread_env(DDP_INDEX_LOG=index_log))
        def training():
            if '"epoch": 50,' not in (read_text(index_log) or ""):
                return None
            return rank_of_ddp_run(proc.pid, 1, "custom_loop")
        out, err = kill_when_found(proc, training, "epoch 50 to be under way", 300)
        self.assertEqual(proc.returncode, 0, out + err)
        self.assertIn("rank 1 exited with code 137; restarting it", err)
        self.assertIn("job program SUCCEEDED", out)
        coverage.check(coverage.read_lines(index_log), 4096, epochs)

    def test_under_ddp_run_min_nproc_survivors_train_on(self):
        # --min_nproc 1 of 2, no restarts: both copies start together, the
        # killed one is not replaced, and the survivor trains on alone to the
        # job's end.
        logs = os.path.join(self.dir, "logs-min-nproc")
        index_log = os.path.join(self.dir, "min-nproc.idx.jsonl")
        # The kill follows the first epoch within moments: 39 are left.
        epochs = 40
        proc = subprocess.Popen(
            [os.path.join(self.prefix, "bin/ddp-run"), "--nproc=2", "--min_nproc=1",
             "--max_restarts=0", "--log_dir=" + logs, "--", self.program, "--data",
             os.path.join(self.dir, "data-min-nproc"), "--epochs", str(epochs)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=thread_env(DDP_INDEX_LOG=index_log))
        # Killed once both ranks have trained an epoch: a program loses a
        # peer gracefully only after set_elastic_state (a rank lost while the
        # survivor still constructs its DistributedDataParallel ends the job,
        # as the README says).
        def rank_one_training():
            if "epoch 0 loss" not in (read_text(os.path.join(logs, "rank-0.log")) or ""):
                return None
            return rank_of_ddp_run(proc.pid, 1, "custom_loop")
        out, err = kill_when_found(proc, rank_one_training, "rank 1 to train", 600)
        survivor = read_text(os.path.join(logs, "rank-0.log")) or ""  # its output and log
        self.assertEqual(proc.returncode, 0, out + err + survivor[-3000:])
        self.assertRegex(survivor, r"joined generation 1 of job program as rank \d of 2")
        self.assertIn("rank 1 exited with code 137; 1 rank(s) train on (--min_nproc 1)", err)
        self.assertRegex(survivor, r"re-formed into generation \d+ as rank 0 of 1 ")
        self.assertIn("job program SUCCEEDED", out)
        self.check_trained(survivor)
        # From two ranks to one, every sample of every epoch once.
        coverage.check(coverage.read_lines(index_log), 4096, epochs)

    def test_joins_a_coordinator_started_by_hand(self):
        # The program job file the README and the example give.
        with open(os.path.join(REPO, "examples/custom_loop/program-job.json")) as f:
            cluster = Cluster(job=json.load(f))
        try:
            argv = [self.program, "--data", os.path.join(self.dir, "data-joined"), "--epochs", "20"]
            procs = [cluster.start_program(i, argv) for i in range(2)]
            for p in procs:
                p.wait(timeout=300)
            outs = [cluster.log("program-%d" % i) for i in range(2)]
            self.assertEqual([p.returncode for p in procs], [0, 0], "\n".join(outs))
            self.check_trained(outs[0])
            status = cluster.wait_state("JOB_STATE_SUCCEEDED", timeout=30)
            self.assertEqual(int(status["global_step"]), 1280)
            workers = status["workers"]
            self.assertEqual(len(workers), 2)
            for w in workers:  # gone by now, with what they reported
                self.assertEqual(int(w["step"]), 1280)
                self.assertGreater(w["last_loss"], 0)
                self.assertEqual(w["probe"]["backend"], "shm")
            # Finished and gone: done, not lost (the snapshot may lag the
            # streams' closing by a moment).
            wait_for(lambda: all(w["state"] == "WORKER_STATE_DONE"
                                 for w in cluster.status()["workers"]), 30,
                     "the finished programs to show DONE")
        finally:
            cluster.stop()

    def test_elastic_a_lost_rank_and_a_replacement_rejoin_at_step_boundaries(self):
        self.check_elastic("auto")  # shared memory: one machine

    def test_elastic_over_gloo_with_gradient_accumulation(self):
        # Two batches a step: a re-formation between them starts the group
        # over (the loop sees the generation change); a loop that did not
        # could leave its ranks a batch apart, and their collectives
        # misaligned.
        self.check_elastic("gloo", ["--accumulate", "2"])

    def test_elastic_a_rank_joining_at_an_epoch_end_starts_the_next_epoch_with_the_others(self):
        # One batch an epoch, so the step the others leave after to admit
        # the joiner always ends an epoch: they run their end-of-epoch
        # all-reduce in the generation that trained it, then re-form at the
        # next epoch's first batch, where the joiner starts. (Re-forming at
        # the epoch's end instead left them in that all-reduce while the
        # joiner trained: "collectives are misaligned".)
        cluster = Cluster(job={"name": "spirals", "model": {"kind": "program"}, "minWorkers": 2,
                               "maxWorkers": 3, "settleSeconds": 1,
                               "reformMinIntervalSeconds": 1})
        try:
            argv = [self.program, "--data", os.path.join(self.dir, "data-epoch-end"), "--epochs",
                    "1000", "--batch", "4096"]
            procs = [cluster.start_program(i, argv) for i in range(2)]
            cluster.wait_for(lambda: int(cluster.status().get("global_step", 0)) > 50, 120,
                             "two ranks to train")
            procs.append(cluster.start_program(2, argv))
            cluster.wait_for(lambda: (lambda s: s.get("world_size") == 3 and
                                        int(s["generation"]) == 2)(cluster.status()),
                             60, "the joiner to join")
            for p in procs:
                p.wait(timeout=300)
            logs = [cluster.log("program-%d" % i) for i in range(3)]
            self.assertEqual([p.returncode for p in procs], [0, 0, 0], "\n".join(logs))
            cluster.wait_state("JOB_STATE_SUCCEEDED", timeout=30)
            for i in (0, 1):
                self.assertRegex(logs[i], r"re-formed into generation 2 as rank \d of 3 at step "
                                          r"\d+ \(epoch \d+, cursor 0\)")
        finally:
            cluster.stop()

    def check_elastic(self, backend, extra=()):
        # Joiners admitted a second after the last generation formed, not
        # the default ten (the interval has tests of its own, in
        # tests/unit/coordinator_membership_test.cc): the replacement joins
        # by about epoch 50-90 of the 200 on this 2-core machine.
        # Settle 5 s: the three copies start together, and a slow machine
        # may take seconds more to load LibTorch in one of them; the first
        # generation forms at once when all three have come.
        cluster = Cluster(job={"name": "spirals", "model": {"kind": "program"}, "minWorkers": 2,
                               "maxWorkers": 3, "settleSeconds": 5, "backend": backend,
                               "reformMinIntervalSeconds": 1})
        try:
            argv = [self.program, "--data", os.path.join(self.dir, "data-elastic-" + backend),
                    "--epochs", "200"] + list(extra)
            procs = [cluster.start_program(i, argv) for i in range(3)]

            def running(world):
                s = cluster.status()
                return (s["state"] == "JOB_STATE_RUNNING" and s.get("world_size") == world and
                        int(s.get("global_step", 0)) > 1000)
            cluster.wait_for(lambda: running(3) and int(cluster.status()["generation"]) == 1,
                             120, "three ranks to train in generation 1")
            procs[2].kill()
            procs[2].wait()
            cluster.wait_for(lambda: running(2) and int(cluster.status()["generation"]) == 2, 60,
                             "the two survivors to re-form")
            procs.append(cluster.start_program(3, argv))  # a replacement
            cluster.wait_for(lambda: running(3) and int(cluster.status()["generation"]) == 3, 60,
                             "the replacement to join")
            for p in procs[:2] + procs[3:]:
                p.wait(timeout=300)
            logs = {i: cluster.log("program-%d" % i) for i in (0, 1, 3)}
            self.assertEqual([p.returncode for p in procs[:2] + procs[3:]], [0, 0, 0],
                             "\n".join(logs.values()))
            # The snapshot may lag the processes' going by a moment.
            status = cluster.wait_state("JOB_STATE_SUCCEEDED", timeout=30)
            self.check_trained(logs[0])
            # What holds whatever the kill interrupted (a backward, or a
            # collective of the program's own, which drops no step).
            where = {}
            for i in (0, 1):  # the survivors
                for generation in (2, 3):
                    m = re.search(r"re-formed into generation %d as rank \d of \d at step (\d+) "
                                  r"\(epoch (\d+), cursor (\d+)\)" % generation, logs[i])
                    self.assertIsNotNone(m, logs[i])
                    where.setdefault(generation, set()).add(tuple(int(g) for g in m.groups()))
                # The join cost no step: the ranks voted to leave after a
                # step they all completed.
                self.assertRegex(logs[i], r"re-formed into generation 3 .* after: generation 2 "
                                          r"ended after step \d+")
                # The kill cost at most the step in flight: the one after
                # the step the job went on from (or that step itself, for a
                # rank that saw it fail while another completed it).
                dropped = [int(n) for n in re.findall(r"step (\d+) dropped", logs[i])]
                self.assertLessEqual(len(dropped), 1, logs[i])
                resumed = next(iter(where[2]))[0]
                for step in dropped:
                    self.assertIn(step, (resumed, resumed + 1), logs[i])
            # Every rank went on from the same step and data position, and
            # never back: no step applied twice.
            self.assertEqual(len(where[2]), 1, where)
            self.assertEqual(len(where[3]), 1, where)
            (step2, epoch2, cursor2), (step3, epoch3, cursor3) = where[2].pop(), where[3].pop()
            self.assertGreaterEqual(step3, step2)
            self.assertGreaterEqual((epoch3, cursor3), (epoch2, cursor2))
            self.assertRegex(logs[3], r"took up rank \d's state at step %d " % step3)
            # The replicas stayed equal: the ranks' parameter digests agree at
            # each step they were compared (the coordinator fails the job
            # otherwise).
            by_step = {}
            for w in status["workers"]:
                if w.get("parameter_digest"):
                    by_step.setdefault(w["digest_step"], set()).add(w["parameter_digest"])
            self.assertTrue(by_step, status["workers"])
            for step, digests in by_step.items():
                self.assertEqual(len(digests), 1, (step, digests))
        finally:
            cluster.stop()

    def test_training_goes_on_through_a_coordinator_restart(self):
        port = free_port()
        state = tempfile.mkdtemp(prefix="ddp-restart-", dir=self.dir)
        job = os.path.join(state, "job.json")
        with open(job, "w") as f:
            f.write('{"name": "spirals", "model": {"kind": "program"}, "minWorkers": 2}')
        target = "127.0.0.1:%d" % port

        log = os.path.join(state, "coordinator.log")

        def coordinator():
            with open(log, "a") as out:
                return subprocess.Popen(
                    [os.path.join(BIN, "ddp-coordinator"), "--listen=" + target, "--job=" + job,
                     "--state_dir=" + os.path.join(state, "state"), "--metrics_listen=",
                     "--http_listen=", "--exit_when_done"], stdout=out, stderr=subprocess.STDOUT)
        first = coordinator()
        # 64000 steps: the restart (about 3 s) is over long before, however
        # fast the machine (16000 were all done by then on one); checked
        # below.
        argv = [self.program, "--data", os.path.join(self.dir, "data-restart"),
                "--epochs", str(EPOCHS_THROUGH_RESTART)]
        procs = [subprocess.Popen(argv, env=thread_env(DDP_COORDINATOR=target, LOCAL_RANK=str(i)),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for i in range(2)]
        try:
            wait_for(lambda: "formed with" in (read_text(log) or ""), 60, "generation 1 to form")
            time.sleep(0.5)
            first.kill()
            first.wait()
            time.sleep(2)  # the ranks train on without it
            second = coordinator()
            outs = [p.communicate(timeout=300)[0] for p in procs]
            self.assertEqual([p.returncode for p in procs], [0, 0], "\n".join(outs))
            self.assertEqual(second.wait(timeout=30), 0)
            self.check_trained(outs[0])
            text = read_text(log)
            self.assertIn("adopted generation 1", text)
            self.assertIn("job spirals succeeded in generation 1", text)
            # They came back mid-job: training went on through the restart.
            held = [int(n) for n in re.findall(r'holding job "spirals" at step (\d+)', text)]
            self.assertEqual(len(held), 2, text)
            self.assertLess(max(held), EPOCHS_THROUGH_RESTART * 64, text)
        finally:
            for p in procs + [first]:
                if p.poll() is None:
                    p.kill()

    def test_under_ddp_run_over_mutual_tls_with_tokens(self):
        pki = Pki()
        try:
            out = run([os.path.join(self.prefix, "bin/ddp-run"), "--nproc=2",
                       "--tls_cert=" + pki.server[0], "--tls_key=" + pki.server[1],
                       "--tls_ca=" + pki.ca, "--tokens_file=" + pki.tokens_file, "--",
                       self.program, "--data", os.path.join(self.dir, "data-tls"),
                       "--epochs", "10"], timeout=300)
            self.check_trained(out)
            self.assertIn("job program SUCCEEDED", out)
        finally:
            pki.remove()

    def test_refusals_say_what_to_fix(self):
        argv = [self.program, "--data", os.path.join(self.dir, "data-refused"), "--epochs", "1"]
        pki = Pki()
        # No token for a coordinator that wants one: refused for good, at once.
        cluster = Cluster(job={"name": "spirals", "model": {"kind": "program"}},
                          extra_flags=["--tokens_file=" + pki.tokens_file],
                          client_options={"token": pki.tokens["admin"]})
        try:
            p = cluster.start_program(0, argv)
            p.wait(timeout=60)
            self.assertNotEqual(p.returncode, 0)
            out = cluster.log("program-0")
            self.assertIn("refused this program: UNAUTHENTICATED", out)
            # The right token: it trains.
            p = cluster.start_program(0, argv, DDP_TOKEN_FILE=pki.token_files["worker"])
            p.wait(timeout=120)
            self.assertEqual(p.returncode, 0, cluster.log("program-0"))
            self.assertEqual(cluster.wait_state("JOB_STATE_SUCCEEDED", 30)["state"],
                             "JOB_STATE_SUCCEEDED")
        finally:
            cluster.stop()
            pki.remove()
        # A coordinator whose job is a ddp-worker's: no rank for a program.
        cluster = Cluster(job=synthetic_job("builtin", 1))
        try:
            p = cluster.start_program(0, argv, DDP_TIMEOUT_SECONDS="3")
            p.wait(timeout=60)
            self.assertNotEqual(p.returncode, 0)
            out = cluster.log("program-0")
            self.assertIn("got no rank within 3s", out)
            self.assertIn('model.kind "program"', out)
            self.assertEqual(cluster.status()["state"], "JOB_STATE_WAITING")
        finally:
            cluster.stop()

    def test_a_killed_rank_ends_the_other_at_once_with_the_coordinators_reason(self):
        cluster = Cluster(job={"name": "spirals", "model": {"kind": "program"}, "minWorkers": 2,
                               "faultBudget": 0, "collectiveTimeoutSeconds": 600})
        try:
            argv = [self.program, "--data", os.path.join(self.dir, "data-kill"),
                    "--epochs", "100000"]
            procs = [cluster.start_program(i, argv) for i in range(2)]
            wait_for(lambda: int(cluster.status().get("global_step", 0)) > 50, 120,
                     "the ranks to train")
            procs[1].kill()
            killed = time.time()
            procs[0].wait(timeout=60)
            # Found by the coordinator in seconds, not the 600 s collective
            # timeout, and said by the survivor.
            self.assertLess(time.time() - killed, 20)
            self.assertNotEqual(procs[0].returncode, 0)
            out = cluster.log("program-0")
            self.assertIn("the coordinator ended generation 1", out)
            self.assertIn("lost", out)
            status = cluster.wait_state("JOB_STATE_FAILED", timeout=30)
            self.assertIn("lost", status["message"])
        finally:
            cluster.stop()

    def test_runs_two_way_started_as_torchrun_starts_ranks(self):
        port = str(free_port())
        secret = secrets.token_hex(16)  # the same on every rank
        procs = [subprocess.Popen(
            [self.program, "--data", os.path.join(self.dir, "data-env"), "--epochs", "10"],
            env=thread_env(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                           DDP_STORE_SECRET=secret),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
        outs = [p.communicate(timeout=300)[0] for p in procs]
        self.assertEqual([p.returncode for p in procs], [0, 0], "\n".join(outs))
        self.check_trained(outs[0])


if __name__ == "__main__":
    unittest.main()
