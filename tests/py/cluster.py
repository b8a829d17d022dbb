"""Real processes on loopback for the tests: a coordinator, workers, ddp-run."""
import glob
import json
import os
import pwd
import signal
import subprocess
import tempfile

from grpc_reflect import ReflectionClient
from harness import BIN, RunFolder, thread_env, wait_for, wait_port_file

TMP = os.path.realpath(tempfile.gettempdir())
# Tests keep their models, data and outputs in temporary folders, and run as
# the user who runs them, as ddp-run does: the coordinator must allow both.
ROOT_FLAGS = ["--data_root=/usr/share/datasets," + TMP, "--output_root=" + TMP,
              "--validate_user=" + pwd.getpwuid(os.geteuid()).pw_name]


class Cluster(RunFolder):
    """A coordinator on a free port and the workers the test starts."""

    def __init__(self, job=None, heartbeat_timeout="5s", extra_flags=(), client_options=None,
                 worker_flags=()):
        """`client_options`: ReflectionClient's TLS and token arguments;
        `worker_flags`: added to every worker's command line (TLS, token)."""
        super().__init__(tempfile.mkdtemp(prefix="ddp-test-"))
        self.procs = []
        self.worker_flags = list(worker_flags)
        port_file = os.path.join(self.dir, "port")
        args = [os.path.join(BIN, "ddp-coordinator"), "--listen=127.0.0.1:0",
                "--port_file=" + port_file, "--heartbeat_timeout=" + heartbeat_timeout,
                # Metrics and the status page off unless a test turns them on
                # (extra_flags win): tests run side by side and must not race
                # for their default ports.
                "--metrics_listen=", "--http_listen="] + ROOT_FLAGS
        if job is not None:
            job_file = os.path.join(self.dir, "job.json")
            with open(job_file, "w") as f:
                json.dump(job, f)
            args.append("--job=" + job_file)
        args.extend(extra_flags)
        self.coordinator = self._start("coordinator", args)
        self.port = wait_port_file(port_file, 30, "the coordinator to serve", self.coordinator)
        self.target = "127.0.0.1:%d" % self.port
        self.client = ReflectionClient(self.target, **(client_options or {}))

    def _start(self, name, args, env=None):
        with open(os.path.join(self.dir, name + ".log"), "w") as log:
            p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                 env=env or thread_env(), start_new_session=True)
        p.name = name
        self.procs.append(p)
        return p

    def start_worker(self, index, name=None, extra=()):
        name = name or "w%d" % index
        # Metrics endpoint off: tests run side by side (extra may turn it on).
        extra = ["--metrics_listen="] + self.worker_flags + list(extra)
        return self._start(name, self.worker_command(self.target, index, name, extra=extra))

    def start_program(self, index, argv, **env):
        """A copy of a program on the ddp library, joined to this coordinator
        as ddp-run joins one (its output in program-INDEX.log); `env` adds
        variables (DDP_TOKEN_FILE, ...)."""
        env = thread_env(DDP_COORDINATOR=self.target, LOCAL_RANK=str(index), **env)
        return self._start("program-%d" % index, argv, env=env)

    def status(self):
        return self.client.call("ddp.v1.Coordinator/GetStatus")

    def wait_for(self, predicate, timeout, what):
        """harness.wait_for, and on a timeout the tail of every log in the
        run's folder: what a CI log needs to say why."""
        try:
            return wait_for(predicate, timeout, what)
        except AssertionError as e:
            raise AssertionError("%s\n%s" % (e, self.logs_tail())) from None

    def logs_tail(self, limit=2000):
        names = sorted(n for n in os.listdir(self.dir) if n.endswith(".log"))
        return "\n".join("--- %s (tail)\n%s" % (n, self.log(n[:-4])[-limit:]) for n in names)

    def wait_state(self, states, timeout=120):
        states = states if isinstance(states, (list, tuple)) else [states]
        return wait_for(lambda: (lambda s: s if s.get("state") in states else None)(self.status()),
                        timeout, "job state in %s (last: %s)" % (states, self._brief()))

    def _brief(self):
        try:
            s = self.status()
            return "%s %s" % (s.get("state"), s.get("message"))
        except Exception as e:  # noqa: BLE001 - only for the error message
            return repr(e)

    def stop(self):
        self.client.close()
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def children_of(pid, comm=None):
    """Processes whose parent is `pid` (named `comm`, when given), from /proc."""
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open("/proc/%s/comm" % entry) as f:
                name = f.read().strip()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and comm in (None, name):
            kids.append(int(entry))
    return kids


def rank_of_ddp_run(pid, local_rank, comm=None):
    """The copy of a program ddp-run `pid` started as LOCAL_RANK `local_rank`
    (named `comm`, when given), or None."""
    for kid in children_of(pid, comm):
        try:
            with open("/proc/%d/environ" % kid, "rb") as f:
                if b"LOCAL_RANK=%d\0" % local_rank in f.read():
                    return kid
        except OSError:  # gone meanwhile
            pass
    return None


def synthetic_job(name, workers, **overrides):
    job = {"name": name, "model": {"kind": "mlp"},
           "dataset": {"kind": "synthetic", "trainSize": 2048, "testSize": 256},
           "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.9},
           "batchSize": 32, "epochs": 1, "backend": "gloo",
           "minWorkers": workers, "maxWorkers": workers, "settleSeconds": 0}
    job.update(overrides)
    return job


def step_losses(folder, index_lines, job):
    """{(step, rank): loss} of job `job`'s steps, from the step records the
    workers wrote in `folder` (*.steps.jsonl, --metrics_file): a generation
    names one job's, as the index logs (`index_lines`) say."""
    generations = {l["generation"] for l in index_lines if l["job"] == job}
    out = {}
    for path in glob.glob(os.path.join(folder, "*.steps.jsonl")):
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                report = record["report"]
                if int(report["generation"]) in generations:
                    out[(int(report["step"]), record.get("rank", 0))] = report["loss"]
    return out

