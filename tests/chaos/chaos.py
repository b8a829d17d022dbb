"""Chaos for real processes: a coordinator and workers on loopback (or in
network namespaces), faults caused for real (kill -9, SIGSTOP, a stalled
training thread, a cut link, a killed coordinator), and the checks every
chaos run ends with: the job succeeds, every epoch trains each sample once,
no fault loses more than the step in flight, accuracy stays within a point
of an undisturbed run, and nothing is left behind."""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "py"))
sys.path.insert(0, HERE)

import coverage  # noqa: E402
from harness import BIN, RunFolder, free_port, thread_env, wait_for, wait_listening  # noqa: E402
from grpc_reflect import ReflectionClient  # noqa: E402

FASHION_MNIST_TRAIN = 60000


def chaos_job(name, **overrides):
    """An MLP on Fashion-MNIST: long enough for several faults, short enough
    for CI (about 100 steps a second on three workers here)."""
    job = {"name": name, "model": {"kind": "mlp"}, "dataset": {"kind": "fashion-mnist"},
           "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9}, "batchSize": 64,
           "epochs": 4, "seed": 7, "backend": "auto", "minWorkers": 2, "maxWorkers": 3,
           "settleSeconds": 30, "reformMinIntervalSeconds": 1, "hangTimeoutSeconds": 3,
           "rejoinTimeoutSeconds": 120}
    job.update(overrides)
    return job


def shm_segments(pids=None):
    """The shared-memory segments workers make (/dev/shm/ddp-<pid>-...); with
    `pids`, only those the processes `pids` made: other runs on a shared
    machine make theirs too."""
    names = {n for n in os.listdir("/dev/shm") if n.startswith("ddp-")}
    if pids is None:
        return names
    own = {str(p) for p in pids}
    return {n for n in names if n.split("-")[1] in own}


class RunFiles(RunFolder):
    """A finished run's folder, read again later (bench/resilience.py
    --reanalyze): what faults.analyze() needs of a run; a ChaosRun is one."""

    def __init__(self, folder, job):
        super().__init__(folder)
        self.job = job

    def index_lines(self):
        return coverage.read_lines(os.path.join(self.dir, "*.idx.jsonl"))


class ChaosRun(RunFiles):
    """One job on a coordinator and `workers` workers; processes are started
    in `net`'s namespaces when one is given (coordinator on host 0, worker i
    on host i + 1), else on loopback."""

    def __init__(self, job, workers=3, net=None, heartbeat_timeout="2s", extra_coordinator=()):
        super().__init__(tempfile.mkdtemp(prefix="ddp-chaos-"), job)
        self.net = net
        self.procs = {}
        self.finished = []  # (name, Popen) of processes replaced by a restart
        self.sent = set()  # (name, signal) the test sent
        self.all_pids = []
        self.events = []  # (time, what) of every fault caused
        self.port = free_port() if net is None else 29400
        host = "127.0.0.1" if net is None else net.hosts[0].ip
        self.target = "%s:%d" % (host, self.port)
        with open(os.path.join(self.dir, "job.json"), "w") as f:
            json.dump(job, f)
        self.coordinator_args = [
            os.path.join(BIN, "ddp-coordinator"), "--listen=%s" % self.target,
            "--job=" + os.path.join(self.dir, "job.json"),
            "--state_dir=" + os.path.join(self.dir, "state"),
            "--heartbeat_interval=0.5s", "--heartbeat_timeout=" + heartbeat_timeout,
            "--adopt_grace=10s",
            # Checkpoint folders are temporary ones, and must lie under an
            # output root.
            "--output_root=" + os.path.realpath(tempfile.gettempdir())] + list(extra_coordinator)
        if net is not None:
            # The namespaces' veth network is the test's own; what is
            # under test here is faults, not authentication (auth_test).
            self.coordinator_args.append("--insecure")
        self.start_coordinator()
        self.client = ReflectionClient(self.status_target())
        wait_for(self.status, 30, "the coordinator to serve")
        for i in range(workers):
            self.start_worker(i)

    def status_target(self):
        """The one coordinator address status calls go to."""
        return self.target

    # ---- processes -------------------------------------------------------

    def crashed(self):
        """Processes that ended by a signal nobody sent them (a crash)."""
        out = []
        for name, p in self.finished + list(self.procs.items()):
            code = p.poll()
            if code is not None and code < 0 and (name, -code) not in self.sent:
                out.append("%s (pid %d): %s" % (name, p.pid, signal.Signals(-code).name))
        return out

    def _start(self, name, args, host=None):
        env = thread_env()
        log = open(os.path.join(self.dir, name + ".log"), "a")
        if self.net is not None and host is not None:
            p = self.net.popen(host, args, stdout=log, stderr=subprocess.STDOUT, env=env)
        else:
            p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)
        log.close()
        if name in self.procs:
            self.finished.append((name, self.procs[name]))
        self.procs[name] = p
        self.all_pids.append(p.pid)
        return p

    def start_coordinator(self):
        p = self._start("coordinator", self.coordinator_args, host=0)
        host, port = self.target.rsplit(":", 1)
        wait_listening(host, port, 30, "the coordinator to listen on " + self.target, p)
        if hasattr(self, "client"):
            # A fresh channel: the old one backs off after the refused
            # connections of the outage.
            self.client.close()
            self.client = ReflectionClient(self.target)
        return p

    def worker_name(self, i):
        return "w%d" % i

    def start_worker(self, i):
        name = self.worker_name(i)
        host = "127.0.0.1" if self.net is None else self.net.hosts[i + 1].ip
        args = self.worker_command(self.target, i, name, host, extra=[
            "--index_log=" + os.path.join(self.dir, name + ".idx.jsonl"),
            "--debug_hang_file=" + self.hang_file(i)])
        return self._start(name, args, host=None if self.net is None else i + 1)

    def hang_file(self, i):
        return os.path.join(self.dir, "hang-%d" % i)

    def signal(self, name, sig):
        self.events.append((time.time(), "%s %s" % (signal.Signals(sig).name, name)))
        self.sent.add((name, sig))
        if sig in (signal.SIGSTOP, signal.SIGCONT):
            # The whole process group: a worker daemon and its job's process
            # stop together, as a frozen machine or container would.
            os.killpg(self.procs[name].pid, sig)
        else:
            self.procs[name].send_signal(sig)

    def kill(self, name):
        self.signal(name, signal.SIGKILL)
        self.procs[name].wait(timeout=10)

    # ---- observing -------------------------------------------------------

    def status(self):
        return self.client.call("ddp.v1.Coordinator/GetStatus")

    def step(self):
        try:
            return int(self.status().get("global_step", 0))
        except Exception:  # noqa: BLE001 - a restarting coordinator
            return 0

    def members(self):
        return self.status().get("members", [])

    def wait_state(self, states, timeout=120):
        states = states if isinstance(states, (list, tuple)) else [states]
        return wait_for(lambda: (lambda s: s if s.get("state") in states else None)(self.status()),
                        timeout, "job state in %s" % (states,), interval=0.1)

    def wait_step_past(self, step, timeout=60):
        wait_for(lambda: self.step() > step, timeout, "global step past %d" % step,
                 interval=0.05)

    def wait_generation_past(self, generation, timeout=60):
        """Until a generation after `generation` runs and has stepped."""
        def ok():
            s = self.status()
            return (int(s.get("generation", 0)) > generation and
                    s.get("state") == "JOB_STATE_RUNNING" and
                    s.get("generation_changes", [{}])[-1].get("pause_seconds", 0) > 0)
        wait_for(ok, timeout, "a generation after %d to train" % generation, interval=0.05)

    def generation(self):
        return int(self.status().get("generation", 0))

    # ---- the end ---------------------------------------------------------

    def finish(self, timeout=300):
        return self.wait_state(["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"],
                               timeout)

    def close(self):
        try:
            self.client.close()
        except Exception:  # noqa: BLE001
            pass
        for name, p in self.procs.items():
            if p.poll() is None:
                self.sent.add((name, signal.SIGTERM))
                try:
                    os.killpg(p.pid, signal.SIGCONT)
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def leftovers(self):
        """Processes of this run still alive, and /dev/shm segments it left."""
        alive = []
        for pid in self.all_pids:
            try:
                os.kill(pid, 0)
                with open("/proc/%d/stat" % pid) as f:
                    if f.read().split()[2] != "Z":
                        alive.append(pid)
            except (ProcessLookupError, FileNotFoundError):
                pass
        return alive, sorted(shm_segments(self.all_pids))


def check_run(test, run, final, baseline_accuracy, dataset_size=FASHION_MNIST_TRAIN,
              max_steps_lost=0):
    """The checks every chaos run ends with."""
    test.assertEqual(final["state"], "JOB_STATE_SUCCEEDED", final.get("message"))
    coverage.check(run.index_lines(), dataset_size, int(run.job["epochs"]))
    for change in final.get("generation_changes", []):
        test.assertLessEqual(int(change.get("steps_lost", 0)), max_steps_lost, change)
    accuracy = final.get("test_accuracy", 0)
    print("accuracy %.4f (undisturbed %.4f), %d generation(s)" % (
        accuracy, baseline_accuracy, len(final.get("generation_changes", []))), flush=True)
    test.assertLess(abs(accuracy - baseline_accuracy), 0.01,
                    "accuracy %.4f, undisturbed %.4f" % (accuracy, baseline_accuracy))
    run.close()
    test.assertEqual(run.crashed(), [], "processes that crashed")
    alive, segments = run.leftovers()
    test.assertEqual(alive, [], "processes left behind")
    test.assertEqual(segments, [], "/dev/shm segments left behind")


_BASELINES = {}


def baseline(job, workers=3):
    """Test accuracy of the job undisturbed (cached per job)."""
    key = json.dumps(job, sort_keys=True) + str(workers)
    if key not in _BASELINES:
        run = ChaosRun(dict(job, name=job["name"] + "-base"), workers)
        try:
            final = run.finish()
            assert final["state"] == "JOB_STATE_SUCCEEDED", final
            _BASELINES[key] = (final["test_accuracy"], run)
        finally:
            run.close()
    return _BASELINES[key][0]


def pick(rng, names):
    return names[rng.randrange(len(names))]


def seeded_rng():
    seed = int(os.environ.get("DDP_CHAOS_SEED", str(int(time.time()))))
    print("chaos seed %d (DDP_CHAOS_SEED to repeat)" % seed, flush=True)
    return random.Random(seed)
