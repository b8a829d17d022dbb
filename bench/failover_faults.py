"""Coordinators that fail over through etcd, faults caused for real and
measured: the "Coordinators that fail over" rows of docs/RESILIENCE.md.
bench/resilience.py imports this for its failover kinds:

    /usr/bin/python3 bench/resilience.py --kinds leader_kill9,leader_stop,etcd_member,etcd_down
    /usr/bin/python3 bench/resilience.py --kinds etcd_load   # etcd writes at 1,000 workers

For each kind: one job (tests/chaos/chaos.py's chaos_job, with epochs enough
for the faults; a second or third if it ends first) on tests/chaos/
failover.py's FailoverRun: two ddp-coordinator processes on a 3-member etcd
(tests/py/etcd_cluster.py, one of its own per kind), three workers given
both addresses. The fault is caused --injections times, each once the
previous one recovered (a leader again, the other coordinator back as its
standby, three workers training in the leader's generation) and 20-80 more
steps were trained. Throughout, a poller asks every coordinator's GetStatus
every 20 ms (a new call each tick, whether or not the last has answered)
what it says of leadership; "a new leader" is the first answer, to a call
sent after the fault, in which a coordinator other than the old leader says
it leads itself.

After the job ends, from the run's own records: the longest gap between two
consecutive completed steps of one rank (within an epoch and a generation)
around each fault, against the job's median step; generation changes and
steps lost; samples trained twice or never (tests/chaos/coverage.py); and,
from etcd's revision history, the leadership terms and any write made outside
its writer's term (failover.check_terms).
"""
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "chaos"))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))

import grpc  # noqa: E402

import chaos  # noqa: E402
import failover  # noqa: E402
import faults  # noqa: E402
from etcd_cluster import EtcdCluster  # noqa: E402
from grpc_reflect import ReflectionClient  # noqa: E402
from harness import free_port, thread_env, wait_listening  # noqa: E402

# A kind ending in README_ETCD is its base kind against an etcd started as
# README's example starts it (etcd's own timings: heartbeat 100 ms,
# election 1 s, no pre-vote) rather than with the tuned timings of the tests.
README_ETCD = "_readme_etcd"
KINDS = ("leader_kill9", "leader_stop", "leader_partition", "etcd_member", "etcd_down",
         "leader_kill9" + README_ETCD, "leader_stop" + README_ETCD, "etcd_member" + README_ETCD)
LEADER_KINDS = ("leader_kill9", "leader_stop", "leader_partition")


def base_kind(kind):
    """The fault a kind causes, whatever etcd's timings."""
    return kind[:-len(README_ETCD)] if kind.endswith(README_ETCD) else kind


def etcd_timings(kind):
    return "default" if kind.endswith(README_ETCD) else "tuned"

DESCRIPTION = {
    "leader_kill9": "coordinator machine lost: kill -9 of the leader (restarted as a standby)",
    "leader_stop": "leader paused: SIGSTOP for 3 × the lease TTL, then SIGCONT",
    "leader_partition": "leader cut from etcd only (network namespaces), healed after 3 × the TTL",
    "etcd_member": "etcd member lost: kill -9 of one of three (the raft leader every other time), "
                   "restarted after 2 × the TTL",
    "etcd_down": "etcd down: all three members SIGSTOPped 10 s",
}
DESCRIPTION.update({k + README_ETCD: DESCRIPTION[k] + "; etcd at README's (etcd's default) timings"
                    for k in ("leader_kill9", "leader_stop", "etcd_member")})
# Seconds one injection takes here, wait for a settled world included: sizes
# the job (epochs_for).
SECONDS_PER_INJECTION = {"leader_kill9": 8, "leader_stop": 11, "leader_partition": 12,
                         "etcd_member": 10, "etcd_down": 18}
ETCD_DOWN_SECONDS = 10.0

# What the others are documented to do in the same case (not measured here).
KUBERNETES = {
    "leader_kill9": "A crashed leader never releases its Lease: candidates, retrying every 2 s "
                    "(jittered), take it only once it has gone unrenewed for the 15 s lease "
                    "duration as they observe it: a new leader about 15 s after the crash, give or "
                    "take a retry period [k8s-flags][client-go].",
    "leader_stop": "Candidates take the Lease 15 s after the last renewal they saw. The paused "
                   "leader, continued, acts as leader until its own renewal fails: client-go says it "
                   "does not guarantee that only one client acts as leader (no fencing) "
                   "[client-go].",
    "leader_partition": "The cut-off leader can't renew; it stops leading once the 10 s renew "
                        "deadline passes without a renewal (kube-controller-manager and "
                        "kube-scheduler then exit [kcm]); a candidate takes over 15 s after the "
                        "last renewal it saw [k8s-flags]. Nothing fences what the old leader "
                        "writes elsewhere meanwhile [client-go].",
    "etcd_member": "Nothing visible: the API server keeps serving while etcd keeps its quorum "
                   "(2 of 3); an etcd leader election stalls writes for about its election "
                   "timeout (1 s by default), well inside the 10 s renew deadline.",
    "etcd_down": "The API server can't write and the leader's renewals fail: it stops leading "
                 "once the 10 s renew deadline passes (8-10 s into this outage; "
                 "kube-controller-manager and kube-scheduler then exit and are restarted [kcm]); "
                 "a candidate takes the Lease 15 s after the last renewal it saw, about 5 s after "
                 "etcd returns.",
}
TORCHELASTIC = {
    "leader_kill9": "No coordinator process: agents meet in etcd itself. The nearest case, a lost "
                    "node, is a membership change (scale-down) [quickstart]: every worker is "
                    "stopped and restarted after a new rendezvous, from the script's last "
                    "checkpoint [train_script].",
    "leader_stop": "No leader to pause. A paused node stalls its peers in the collective until "
                   "its timeout (10-30 min [pg-timeout]), then all restart from the last "
                   "checkpoint, as for SIGSTOP above.",
    "leader_partition": "Its docs describe no node cut from etcd alone; collectives don't use "
                        "etcd, and the next rendezvous can't complete without it.",
    "etcd_member": "`--rdzv-endpoint` names one etcd host:port [quickstart]: losing another "
                   "member changes nothing while quorum holds; losing that one leaves the agents "
                   "without their rendezvous store.",
    "etcd_down": "etcd is \"the single point of failure for your distributed jobs\" "
                 "[etcd-rdzv]: running collectives go on, but any failure or membership change "
                 "needs a rendezvous, which waits for etcd (600 s default timeout "
                 "[etcd-rdzv-src]), then every worker restarts from the last checkpoint.",
}
SOURCES = {
    "client-go": "https://pkg.go.dev/k8s.io/client-go/tools/leaderelection (package doc: "
                 "\"does not guarantee that only one client is acting as a leader (a.k.a. "
                 "fencing)\")",
    "k8s-flags": "https://kubernetes.io/docs/reference/command-line-tools-reference/"
                 "kube-controller-manager/ (--leader-elect-lease-duration 15s, "
                 "--leader-elect-renew-deadline 10s, --leader-elect-retry-period 2s)",
    "kcm": "https://github.com/kubernetes/kubernetes/blob/master/cmd/kube-controller-manager/"
           "app/controllermanager.go (OnStoppedLeading: \"leaderelection lost\", exit)",
    "etcd-rdzv": "https://pytorch.org/elastic/0.2.0/rendezvous.html (etcd server: \"the single "
                 "point of failure for your distributed jobs\"); today's "
                 "https://docs.pytorch.org/docs/stable/elastic/rendezvous.html calls the etcd "
                 "rendezvous legacy",
    "etcd-rdzv-src": "https://github.com/pytorch/pytorch/blob/main/torch/distributed/elastic/"
                     "rendezvous/etcd_rendezvous.py (_DEFAULT_TIMEOUT 600 s)",
}


def _log(*args):
    print(time.strftime("%H:%M:%S"), *args, flush=True)


# ---- who leads, every 20 ms ------------------------------------------------

class LeaderPoller:
    """Asks each coordinator's GetStatus every `interval` seconds on a thread
    of its own, a new call each tick (a call to a stopped coordinator, or to
    a standby forwarding to one, waits; the next tick's doesn't wait for
    it). Keeps (sent, answered, index, ok, leads itself, leader it names)."""

    def __init__(self, addresses, interval=0.02, timeout=1.0, max_outstanding=25):
        self.addresses = list(addresses)
        self.interval = interval
        self.timeout = timeout
        self.max_outstanding = max_outstanding
        self.samples = []
        self._lock = threading.Lock()
        self._outstanding = [0] * len(self.addresses)
        self._channels = [None] * len(self.addresses)
        self._renewed = [0.0] * len(self.addresses)
        self._stale = [False] * len(self.addresses)
        self._stop = threading.Event()
        self._request = self._response = None
        self._thread = threading.Thread(target=self._loop, daemon=True, name="leader-poller")

    def start(self):
        # The message types, once, from any coordinator's reflection.
        last = None
        for _ in range(100):
            for a in self.addresses:
                client = ReflectionClient(a)
                try:
                    _, self._request, self._response = client.method(
                        "ddp.v1.Coordinator/GetStatus")
                    break
                except (grpc.RpcError, LookupError) as e:
                    last = e
                finally:
                    client.close()
            if self._request is not None:
                break
            time.sleep(0.1)
        if self._request is None:
            raise RuntimeError("no coordinator answered reflection: %s" % last)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=5)
        for c in self._channels:
            if c is not None:
                c[0].close()

    def _call(self, i):
        now = time.time()
        if self._stale[i] and self._channels[i] is not None:
            self._channels[i][0].close()
            self._channels[i] = None
        self._stale[i] = False
        if self._channels[i] is None:
            # Reconnect quickly, as ReflectionClient's channels do.
            ch = grpc.insecure_channel(self.addresses[i], options=[
                ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 200)])
            stub = ch.unary_unary("/ddp.v1.Coordinator/GetStatus",
                                  request_serializer=self._request.SerializeToString,
                                  response_deserializer=self._response.FromString)
            self._channels[i] = (ch, stub)
            self._renewed[i] = now
        return self._channels[i][1]

    def _loop(self):
        while not self._stop.is_set():
            for i in range(len(self.addresses)):
                with self._lock:
                    if self._outstanding[i] >= self.max_outstanding:
                        continue
                    self._outstanding[i] += 1
                sent = time.time()
                try:
                    fut = self._call(i).future(self._request(), timeout=self.timeout)
                except Exception:  # noqa: BLE001 - a closed channel
                    with self._lock:
                        self._outstanding[i] -= 1
                    self._stale[i] = True
                    continue
                fut.add_done_callback(lambda f, i=i, sent=sent: self._done(f, i, sent))
            self._stop.wait(self.interval)

    def _done(self, fut, i, sent):
        now = time.time()
        ok, leads, leader = False, False, ""
        try:
            r = fut.result()
            ok = True
            ld = r.leadership
            leads = bool(ld.is_leader) and ld.this_coordinator == self.addresses[i]
            leader = ld.leader
        except grpc.RpcError as e:
            # A fresh channel for a coordinator that went away (killed, or
            # re-executing itself): the old one would back off.
            details = (e.details() or "").lower()
            if e.code() == grpc.StatusCode.UNAVAILABLE and now - self._renewed[i] > 0.1 and \
                    any(w in details for w in ("connect", "socket", "reset", "closed")):
                self._stale[i] = True
        except Exception:  # noqa: BLE001 - cancelled at the end
            pass
        with self._lock:
            self._outstanding[i] -= 1
            self.samples.append((sent, now, i, ok, leads, leader))

    # ---- questions about what was seen ---------------------------------

    def _after(self, t):
        with self._lock:
            return sorted((s for s in self.samples if s[0] >= t), key=lambda s: s[1])

    def leader(self):
        """The coordinator whose newest answer says it leads, or None."""
        with self._lock:
            newest = {}
            for s in self.samples[-400:]:
                if s[3] and (s[2] not in newest or s[1] > newest[s[2]][1]):
                    newest[s[2]] = s
        leads = [s for s in newest.values() if s[4]]
        return max(leads, key=lambda s: s[1])[2] if leads else None

    def first_claim(self, t, exclude=None):
        """(answer time, index) of the first answer to a call sent at or
        after t in which a coordinator (not `exclude`) says it leads."""
        for s in self._after(t):
            if s[4] and s[2] != exclude:
                return s[1], s[2]
        return None

    def wait_claim(self, t, exclude=None, timeout=30.0, stop=None):
        deadline = time.time() + timeout
        while time.time() < deadline:
            c = self.first_claim(t, exclude)
            if c:
                return c
            if stop is not None and stop():
                return None
            time.sleep(0.02)
        return None

    def last_claim(self, i, t0, t1):
        """The answer time of c<i>'s last claim to lead among calls sent in [t0, t1]."""
        last = None
        for s in self._after(t0):
            if s[0] <= t1 and s[2] == i and s[4]:
                last = s[1]
        return last

    def claims_by_others(self, leader, t0, t1):
        """Answers received in [t0, t1] (whenever sent: a stopped process
        answers its queued calls when continued) in which a coordinator
        other than `leader` said it leads: two leaders seen at once."""
        with self._lock:
            return sorted((round(s[1] - t0, 3), s[2]) for s in self.samples
                          if t0 <= s[1] <= t1 and s[4] and s[2] != leader)

    def longest_without_leader(self, t0, t1):
        """The longest time between two consecutive answers (to calls sent
        in [t0, t1]) in which some coordinator said it leads."""
        times = [t0] + [s[1] for s in self._after(t0) if s[0] <= t1 and s[4]] + [t1]
        return max((b - a for a, b in zip(times, times[1:])), default=t1 - t0)


# ---- who had the CPU -------------------------------------------------------------

class CpuSampler:
    """Every 0.1 s, the CPU seconds each process of the run has used (its
    coordinators, workers, etcd members, and this script with its poller),
    from /proc, into the run's folder (cpu.jsonl): to tell a pause of
    training caused by waiting from one caused by not running."""

    def __init__(self, run, etcd, interval=0.1):
        self.run, self.etcd, self.interval = run, etcd, interval
        self.path = os.path.join(run.dir, "cpu.jsonl")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="cpu-sampler")

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self):
        tick = os.sysconf("SC_CLK_TCK")
        with open(self.path, "a") as f:
            while not self._stop.is_set():
                pids = {n: p.pid for n, p in list(self.run.procs.items()) if p.poll() is None}
                for k, m in enumerate(self.etcd._members):
                    if m.proc is not None and m.proc.poll() is None:
                        pids["m%d" % k] = m.proc.pid
                pids["script"] = os.getpid()
                row = {}
                for n, pid in pids.items():
                    try:
                        with open("/proc/%d/stat" % pid) as st:
                            x = st.read().rsplit(")", 1)[1].split()
                        row[n] = [pid, (int(x[11]) + int(x[12])) / tick]
                    except (OSError, IndexError, ValueError):
                        pass
                f.write(json.dumps({"t": time.time(), "p": row}) + "\n")
                self._stop.wait(self.interval)


def read_cpu(folder):
    path = os.path.join(folder, "cpu.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def cpu_used(samples, t0, t1):
    """Cores each process used over [t0, t1] (consecutive samples of the
    same pid only)."""
    inside = [s for s in samples if t0 <= s["t"] <= t1]
    used = {}
    for a, b in zip(inside, inside[1:]):
        for n, (pid, c) in b["p"].items():
            if n in a["p"] and a["p"][n][0] == pid:
                used[n] = used.get(n, 0.0) + c - a["p"][n][1]
    span = inside[-1]["t"] - inside[0]["t"] if len(inside) >= 2 else 0
    return {n: round(v / span, 2) for n, v in sorted(used.items())} if span > 0 else {}


# ---- the faults --------------------------------------------------------------

@dataclasses.dataclass
class Injection:
    kind: str
    victim: str             # "c0", "etcd m1", "etcd (all)"
    old_leader: int
    t_fault: float
    generation: int
    step: int
    t_new_leader: float = 0.0    # first answer of a new leader (0: none)
    new_leader: int = -1
    t_old_stopped: float = 0.0   # the old leader's last claim to lead after the fault
    t_heal: float = 0.0          # SIGCONT / restart / link back / etcd continued
    t_leader_again: float = 0.0  # etcd kinds: first claim after etcd was whole again
    t_back: float = 0.0          # standby back, three members
    leader_changed: bool = False
    raft_leader: bool = False    # etcd_member: the member killed was etcd's raft leader
    longest_without_leader: float = 0.0
    double_claims: list = dataclasses.field(default_factory=list)
    error: str = ""
    notes: list = dataclasses.field(default_factory=list)


class JobEnded(Exception):
    pass


class Driver:
    """Causes failover faults on a FailoverRun one at a time; each inject()
    returns once the world is whole again, or with Injection.error set."""

    def __init__(self, run, etcd, poller, rng, ttl, log=_log, timeout=60.0, gap_steps=(20, 80)):
        self.run, self.etcd, self.poller, self.rng = run, etcd, poller, rng
        self.ttl = ttl
        self.log = log
        self.timeout = timeout
        self.gap_steps = gap_steps
        self.suspended = set()  # coordinators not to ask (stopped)
        self.n = len(run.addresses)

    # ---- status ----------------------------------------------------------

    def status(self):
        lead = self.poller.leader()
        order = ([lead] if lead is not None else []) + [i for i in range(self.n) if i != lead]
        for i in order:
            if i in self.suspended or self.run.procs["c%d" % i].poll() is not None:
                continue
            try:
                return self.run.client_of(i).call("ddp.v1.Coordinator/GetStatus", timeout=1)
            except (grpc.RpcError, LookupError):
                c = self.run.clients.pop(i, None)
                if c is not None:
                    c.close()
        return {}

    # Waiting and "the job ended" as tests/chaos/faults.py's Driver has them,
    # over this driver's status (any coordinator that answers).
    _wait = faults.Driver._wait
    _ended = faults.Driver._ended

    def _status(self):
        return self.status()

    def _whole(self, s):
        """A leader with every other coordinator its standby, and three
        members training."""
        ld = s.get("leadership") or {}
        return (faults.Driver._trained(s) and len(s.get("members", [])) == 3 and
                ld.get("is_leader") and len(ld.get("standbys") or []) == self.n - 1)

    def ready(self):
        def settled(s):
            if self._ended(s):
                return True
            if not self._whole(s):
                return False
            last = s["generation_changes"][-1]
            return time.time() - last["at_unix_seconds"] - last["pause_seconds"] > 1.0
        s = self._wait(settled, "whole world", timeout=self.timeout * 2)
        if self._ended(s):
            return False
        target = int(s.get("global_step", 0)) + self.rng.randrange(*self.gap_steps)
        s = self._wait(lambda s: self._ended(s) or int(s.get("global_step", 0)) > target,
                       "step %d" % target)
        return not self._ended(s) and self._whole(s) and self.poller.leader() is not None

    def _back(self, inj, what):
        s = self._wait(lambda s: self._ended(s) or self._whole(s), what)
        inj.t_back = time.time()
        return s

    # ---- faults ----------------------------------------------------------

    def inject(self, kind):
        try:
            if not self.ready():
                return None
        except TimeoutError as e:
            self.log("not ready for %s: %s" % (kind, e))
            return None
        s = self.status()
        leader = self.poller.leader()
        inj = Injection(kind, "", leader, 0.0, int(s.get("generation", 0)),
                        int(s.get("global_step", 0)))
        try:
            getattr(self, "_" + kind)(inj)
        except JobEnded:
            self.log("  %s: the job ended before it recovered; not counted" % kind)
            self.repair()
            return None
        except TimeoutError as e:
            inj.error = "%s (run folder %s)" % (e, self.run.dir)
            self.log("  %s: RECOVERY NEVER CAME: %s" % (kind, inj.error))
            self.repair()
        return inj

    def _new_leader(self, inj, timeout=None):
        c = self.poller.wait_claim(inj.t_fault, exclude=inj.old_leader,
                                   timeout=timeout or (self.ttl + 15))
        if c is None:
            raise TimeoutError("no new leader")
        inj.t_new_leader, inj.new_leader = c
        inj.leader_changed = True

    def _seen(self, inj, t1):
        """What the poller saw from the fault until t1."""
        lead = inj.new_leader if inj.new_leader >= 0 else inj.old_leader
        start = inj.t_new_leader or inj.t_fault
        inj.double_claims = self.poller.claims_by_others(lead, start + 0.001, t1) \
            if inj.new_leader >= 0 else []
        inj.longest_without_leader = self.poller.longest_without_leader(inj.t_fault, t1)
        last = self.poller.last_claim(inj.old_leader, inj.t_fault, t1 if inj.new_leader < 0 else
                                      max(inj.t_new_leader, inj.t_heal or inj.t_new_leader))
        inj.t_old_stopped = last or 0.0

    def _leader_kill9(self, inj):
        inj.victim = "c%d" % inj.old_leader
        inj.t_fault = time.time()
        self.run.kill(inj.victim)
        self._new_leader(inj)
        inj.t_heal = time.time()
        self.run.start_one(inj.old_leader)
        self._back(inj, "%s back as a standby" % inj.victim)
        self._seen(inj, inj.t_back)

    def _leader_stop(self, inj):
        inj.victim = "c%d" % inj.old_leader
        self.suspended.add(inj.old_leader)
        inj.t_fault = time.time()
        self.run.signal(inj.victim, signal.SIGSTOP)
        try:
            self._new_leader(inj)
            time.sleep(max(0.0, inj.t_fault + 3 * self.ttl - time.time()))
        finally:
            self.run.signal(inj.victim, signal.SIGCONT)
            inj.t_heal = time.time()
            self.suspended.discard(inj.old_leader)
        self._back(inj, "%s back as a standby after SIGCONT" % inj.victim)
        self._seen(inj, inj.t_back)

    def _leader_partition(self, inj):
        inj.victim = "c%d" % inj.old_leader
        inj.t_fault = time.time()
        self.run.cut_from_etcd(inj.old_leader)
        try:
            self._new_leader(inj)
            time.sleep(max(0.0, inj.t_fault + 3 * self.ttl - time.time()))
        finally:
            self.run.heal_from_etcd(inj.old_leader)
            inj.t_heal = time.time()
        self._back(inj, "%s back as a standby after the cut healed" % inj.victim)
        self._seen(inj, inj.t_back)

    def _raft_leader(self):
        return raft_leader(self.etcd.endpoints)

    def _etcd_member(self, inj):
        raft = self._raft_leader()
        count = getattr(self, "_members_killed", 0)
        self._members_killed = count + 1
        if count % 2 == 0 and raft is not None:
            m = raft
        else:
            m = self.rng.choice([k for k in range(3) if k != raft])
        inj.raft_leader = m == raft
        inj.victim = "etcd m%d%s" % (m, " (raft leader)" if inj.raft_leader else "")
        inj.t_fault = time.time()
        self.etcd.kill(m)
        time.sleep(2 * self.ttl)
        inj.t_heal = time.time()
        self.etcd.restart(m)
        inj.notes.append("member answering %.2f s after its restart" % (time.time() - inj.t_heal))
        c = self.poller.first_claim(inj.t_fault, exclude=inj.old_leader)
        if c:
            inj.t_new_leader, inj.new_leader = c
            inj.leader_changed = True
        self._back(inj, "a whole world after etcd member m%d came back" % m)
        c = self.poller.first_claim(inj.t_fault, exclude=inj.old_leader)
        if c and not inj.leader_changed:
            inj.t_new_leader, inj.new_leader = c
            inj.leader_changed = True
        self._seen(inj, inj.t_back)
        if not inj.leader_changed:
            inj.t_old_stopped = 0.0  # it never stopped

    def _etcd_down(self, inj):
        inj.victim = "etcd (all)"
        inj.t_fault = time.time()
        try:
            for k in range(3):
                self.etcd.stop(k)
            time.sleep(ETCD_DOWN_SECONDS)
        finally:
            for k in range(3):
                self.etcd.cont(k)
            inj.t_heal = time.time()
        c = self.poller.wait_claim(inj.t_heal, timeout=30)
        if c is None:
            raise TimeoutError("no leader after etcd came back")
        inj.t_leader_again, inj.new_leader = c
        inj.leader_changed = inj.new_leader != inj.old_leader
        other = self.poller.first_claim(inj.t_fault, exclude=inj.old_leader)
        if other:
            inj.t_new_leader = other[0]
        self._back(inj, "a whole world after etcd came back")
        inj.double_claims = self.poller.claims_by_others(inj.new_leader, inj.t_leader_again + 0.001,
                                                         inj.t_back)
        inj.longest_without_leader = self.poller.longest_without_leader(inj.t_fault, inj.t_back)
        inj.t_old_stopped = self.poller.last_claim(inj.old_leader, inj.t_fault, inj.t_heal) or 0.0

    def repair(self):
        for k in range(3):
            try:
                self.etcd.cont(k)
                if self.etcd._members[k].proc is None:
                    self.etcd.restart(k)
            except Exception as e:  # noqa: BLE001
                self.log("  repair etcd m%d: %s" % (k, e))
        for i in range(self.n):
            name = "c%d" % i
            if hasattr(self.run, "heal_from_etcd") and self.run.net is not None:
                try:
                    self.run.heal_from_etcd(i)
                except Exception:  # noqa: BLE001
                    pass
            p = self.run.procs.get(name)
            if p is not None and p.poll() is None:
                self.run.signal(name, signal.SIGCONT)
            else:
                self.run.start_one(i)
        self.suspended.clear()
        try:
            self._wait(lambda s: self._ended(s) or self._whole(s), "a whole world after repair")
        except TimeoutError as e:
            self.log("  repair: %s" % e)


def raft_leader(endpoints):
    """The index in `endpoints` of etcd's raft leader, or None."""
    ids, leader = {}, None
    for k, ep in enumerate(endpoints):
        st = etcd_status(ep)
        if st:
            ids[st["header"]["member_id"]] = k
            leader = st.get("leader", leader)
    return ids.get(leader)


def etcd_status(endpoint):
    """etcdctl endpoint status of one member, as a dict (None when it can't say)."""
    try:
        out = subprocess.run(["etcdctl", "--endpoints=" + endpoint, "endpoint", "status", "-w",
                              "json", "--command-timeout=2s"], capture_output=True, text=True,
                             timeout=5, env=dict(os.environ, ETCDCTL_API="3"))
        st = json.loads(out.stdout)[0]["Status"]
        return st
    except (subprocess.TimeoutExpired, ValueError, IndexError, KeyError):
        return None


def value_bytes(endpoints, key):
    """The size of `key`'s value in etcd now (None when it can't say)."""
    import base64
    try:
        out = subprocess.run(["etcdctl", "--endpoints=" + ",".join(endpoints), "get", key, "-w",
                              "json"], capture_output=True, text=True, timeout=10,
                             env=dict(os.environ, ETCDCTL_API="3"))
        kvs = json.loads(out.stdout).get("kvs") or []
        return len(base64.b64decode(kvs[0]["value"])) if kvs else None
    except (subprocess.TimeoutExpired, ValueError, KeyError):
        return None


def etcd_proposals(endpoint):
    """etcd_server_proposals_committed_total of one member (its /metrics)."""
    import urllib.request
    try:
        with urllib.request.urlopen("http://%s/metrics" % endpoint, timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("etcd_server_proposals_committed_total "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def etcd_revision(endpoints):
    for ep in endpoints:
        st = etcd_status(ep)
        if st:
            return int(st["header"]["revision"])
    return None


# ---- analysis -----------------------------------------------------------------

def analyze(run, injections, final, dataset_size=chaos.FASHION_MNIST_TRAIN):
    """What the faults of one finished run cost, from its records."""
    rec = faults.Records(run, 3)
    changes = final.get("generation_changes", [])
    median = faults.median_step_seconds(rec)
    times = rec.step_times()
    # From just before the fault until a second after the world was whole
    # again, or until just before the next fault.
    windows = []
    for k, i in enumerate(injections):
        end = (i.t_back or i.t_heal or i.t_fault) + 1.0
        if k + 1 < len(injections):
            end = min(end, injections[k + 1].t_fault - 0.2)
        windows.append((i.t_fault - 0.2, end))
    clogs = {"c%d" % c: faults.read_log(os.path.join(run.dir, "c%d.log" % c)) for c in range(2)}
    cpu = read_cpu(run.dir)
    in_window = lambda t: any(a <= t <= b for a, b in windows)  # noqa: E731
    # The run's own hiccups: its longest gap away from every fault (and
    # from its first 2 s of training, which warm up).
    first = min((lines[0][0] for lines in times.values() if lines), default=0.0)
    quiet = 0.0
    for lines in times.values():
        for (t1, s1, e1, g1), (t2, s2, e2, g2) in zip(lines, lines[1:]):
            if e1 == e2 and g1 == g2 and t1 > first + 2 and not in_window(t1) and \
                    not in_window(t2):
                quiet = max(quiet, t2 - t1)
    results = []
    for inj, (a, b) in zip(injections, windows):
        out = dataclasses.asdict(inj)
        longest, where = 0.0, None
        span = None
        for name, lines in times.items():
            for (t1, s1, e1, g1), (t2, s2, e2, g2) in zip(lines, lines[1:]):
                if t2 < a or t1 > b or e1 != e2 or g1 != g2:
                    continue
                if t2 - t1 > longest:
                    longest, where = t2 - t1, (name, s2, round(t1 - inj.t_fault, 3))
                    span = (t1, t2)
        mine = [c for c in changes if a - 0.3 <= float(c.get("at_unix_seconds", 0)) <= b + 0.5]
        # Steps trained while no coordinator led: from the fault until a new
        # leader answered (for etcd down: until one led again).
        t_led = inj.t_leader_again or inj.t_new_leader or inj.t_fault
        during = {s for lines in times.values() for t, s, _, _ in lines if inj.t_fault < t < t_led}
        detail = None
        if where is not None:
            # Every rank's timers in the step that ended the gap: whose
            # compute it was, and who waited in the all-reduce.
            name, step, _ = where
            detail = {n: {k: m.get(k) for k in ("data_ms", "forward_ms", "backward_ms",
                                                 "allreduce_ms", "wait_ms", "optimizer_ms",
                                                 "step_seconds")}
                      for n, lines in rec.metrics.items() for m in lines
                      if m["step"] == step and m["time"] >= a and m["time"] <= b + 1}
        # What the coordinators logged of leadership in the window.
        lines = [(n, round(t - inj.t_fault, 3), msg[:200]) for n, entries in clogs.items()
                 for t, _, _, msg in entries if a <= t <= b and
                 ("no longer the leader" in msg or msg.startswith("leading:") or
                  msg.startswith("adopted generation"))]
        out.update({
            # Cores each process had around the gap (a quarter second either
            # side), and over the whole window.
            "longest_gap_cpu": cpu_used(cpu, span[0] - 0.25, span[1] + 0.25) if span else {},
            "window_cpu": cpu_used(cpu, a, b),
            "longest_gap_ranks": detail,
            "leadership_log": sorted(lines, key=lambda x: x[1]),
            "new_leader_seconds": (inj.t_new_leader - inj.t_fault) if inj.t_new_leader else None,
            "leader_again_seconds": (inj.t_leader_again - inj.t_heal) if inj.t_leader_again else None,
            "old_stopped_seconds": (inj.t_old_stopped - inj.t_fault) if inj.t_old_stopped else None,
            "back_seconds": (inj.t_back - inj.t_fault) if inj.t_back else None,
            "longest_gap_seconds": longest,
            "longest_gap_at": where,
            "steps_until_leader": len(during),
            "causes": [c.get("cause", "").replace("CHANGE_CAUSE_", "") for c in mine],
            "reformations": sum(1 for c in mine if int(c.get("to_generation", 0)) >
                                int(c.get("from_generation", 0))),
            "steps_lost": sum(int(c.get("steps_lost", 0)) for c in mine),
        })
        results.append(out)
    per_epoch = faults.samples(rec, dataset_size, int(run.job["epochs"]))
    return {
        "dir": run.dir,
        "job": run.job,
        "raw_injections": [dataclasses.asdict(i) for i in injections],
        "final": {k: final.get(k) for k in ("state", "message", "test_accuracy", "elapsed_seconds",
                                            "global_step", "generation_changes")},
        "state": final.get("state"),
        "test_accuracy": final.get("test_accuracy"),
        "elapsed_seconds": final.get("elapsed_seconds"),
        "global_step": int(final.get("global_step", 0)),
        "median_step_seconds": median,
        "quiet_longest_gap": quiet,
        "run_cpu": cpu_used(cpu, first, max((l[-1][0] for l in times.values() if l), default=0)),
        "injections": results,
        "samples": {"skipped": sum(e["skipped"] for e in per_epoch),
                    "duplicated": sum(e["duplicated"] for e in per_epoch),
                    "padding": sum(e["padding"] for e in per_epoch)},
        "all_changes": [{k: c.get(k) for k in ("cause", "from_generation", "to_generation",
                                               "steps_lost", "at_unix_seconds")} for c in changes],
    }


def injection_from(d):
    return Injection(**{f.name: d[f.name] for f in dataclasses.fields(Injection) if f.name in d})


# ---- one kind ------------------------------------------------------------------

def epochs_for(kind, n):
    # 1.4 s an epoch on an idle machine, three times that with a build
    # beside it: too few epochs only means a second job for the rest.
    per_epoch = 3.5 if kind == "leader_partition" else 2.5
    return max(12, int(n * SECONDS_PER_INJECTION[base_kind(kind)] / per_epoch) + 8)


def one_run(kind, n, rng, args, index, log=_log):
    """One job with up to n faults of `kind` on a fresh etcd; its analysis."""
    net = None
    etcd = None
    run = None
    poller = None
    cpu = None
    injections = []
    epochs = args.failover_epochs or epochs_for(kind, n)
    job = chaos.chaos_job("failover-%s-%d" % (kind.replace("_", "-"), index), epochs=epochs)
    try:
        if kind == "leader_partition":
            import netns
            # Host 0 etcd (three members), hosts 1-3 w0-w2, hosts 4-5 c0, c1
            # (failover_netns_test's layout).
            net = netns.Network(["etcd", "w0", "w1", "w2", "c0", "c1"])
            etcd = EtcdCluster(3, net=net, hosts=[0])
            run = failover.FailoverRun(job, etcd, coordinators=2, lease_ttl=args.failover_ttl,
                                       net=net)
        else:
            etcd = EtcdCluster(3, timings=etcd_timings(kind))
            run = failover.FailoverRun(job, etcd, coordinators=2, lease_ttl=args.failover_ttl)
        run.wait_state("JOB_STATE_RUNNING", 60)
        poller = LeaderPoller(run.addresses).start()
        cpu = CpuSampler(run, etcd).start()
        driver = Driver(run, etcd, poller, rng, args.failover_ttl, log=log)
        log("%s: a run of %d epochs for %d faults (%s)" % (kind, epochs, n, run.dir))
        while len(injections) < n:
            inj = driver.inject(base_kind(kind))
            if inj is None:
                log("  the job ended after %d %s faults" % (len(injections), kind))
                break
            injections.append(inj)
            log("  %s #%d: %s (leader c%s) at step %d: %s%s" % (
                kind, len(injections), inj.victim, inj.old_leader, inj.step, describe(inj),
                " ERROR " + inj.error if inj.error else ""))
        final = run.finish(args.job_timeout)
        poller.stop()
        poller = None
        cpu.stop()
        cpu = None
        result = analyze(run, injections, final)
        events = failover.etcd_history(etcd.endpoints, run.prefix, seconds=args.history_seconds)
        terms, problems = failover.check_terms(events, run.prefix)
        result.update({"terms": terms, "term_problems": problems,
                       "history_events": len(events), "epochs": epochs,
                       "lease_ttl": args.failover_ttl})
    finally:
        if poller is not None:
            poller.stop()
        if cpu is not None:
            cpu.stop()
        if run is not None:
            run.close()
        if etcd is not None:
            etcd.close()
        if net is not None:
            net.close()
    result.update(faults.finish_checks(run))
    log("  run %s: %s; samples dup %d / skip %d; %d terms, problems %s; crashed %s" % (
        kind, result["state"], result["samples"]["duplicated"], result["samples"]["skipped"],
        len(result["terms"]), result["term_problems"] or "none", result["crashed"] or "none"))
    return result


def describe(inj):
    if base_kind(inj.kind) in LEADER_KINDS:
        return "new leader c%d after %.2f s (old one's last claim %s s)" % (
            inj.new_leader, inj.t_new_leader - inj.t_fault if inj.t_new_leader else float("nan"),
            "%.2f" % (inj.t_old_stopped - inj.t_fault) if inj.t_old_stopped else "-")
    if base_kind(inj.kind) == "etcd_member":
        return "leader %s; longest without a leader %.2f s" % (
            "changed to c%d" % inj.new_leader if inj.leader_changed else "unchanged",
            inj.longest_without_leader)
    return "old leader's last claim %s s in; a leader (c%d) %.2f s after etcd came back" % (
        "%.2f" % (inj.t_old_stopped - inj.t_fault) if inj.t_old_stopped else "-",
        inj.new_leader, inj.t_leader_again - inj.t_heal if inj.t_leader_again else float("nan"))


def partition_available():
    if not hasattr(failover.FailoverRun, "cut_from_etcd"):
        return False, ("tests/chaos/failover.py has no FailoverRun.cut_from_etcd yet (the network "
                       "namespace support for this row is still being written)")
    import inspect
    if "net" not in inspect.signature(EtcdCluster.__init__).parameters:
        return False, "tests/py/etcd_cluster.py's EtcdCluster takes no `net` yet"
    import netns
    ok, why = netns.available()
    return ok, ("" if ok else "network namespaces can't be made here: " + why)


def measure_kind(kind, args, rng, started, log=_log):
    row = {"kind": kind, "description": DESCRIPTION[kind], "runs": [], "skipped": ""}
    if kind == "leader_partition":
        ok, why = partition_available()
        if not ok:
            row["skipped"] = why
            log("skip leader_partition:", why)
            return row
    while sum(len(r["injections"]) for r in row["runs"]) < args.injections:
        if len(row["runs"]) >= 3:
            break
        if time.time() - started > args.budget_minutes * 60:
            row["skipped"] = "time budget (%d min) spent" % args.budget_minutes
            break
        left = args.injections - sum(len(r["injections"]) for r in row["runs"])
        row["runs"].append(one_run(kind, left, rng, args, len(row["runs"]), log))
    return row


# ---- etcd load at many simulated workers --------------------------------------------

def measure_etcd_load(args, bin_dir, load_bin, log=_log):
    """ddp_load_generator's simulated workers against a coordinator pair on a
    one-member etcd: etcd's revision sampled every second, then what was
    written, per key, from etcd's history."""
    out = {"workers": args.load_workers, "loaded_seconds": args.load_seconds}
    folder = tempfile.mkdtemp(prefix="ddp-etcd-load-")
    etcd = EtcdCluster(1)
    procs = []
    prefix = "/ddp/load"
    samples = []
    stop = threading.Event()
    try:
        addresses = ["127.0.0.1:%d" % free_port() for _ in range(2)]
        for i, a in enumerate(addresses):
            log_file = open(os.path.join(folder, "c%d.log" % i), "w")
            procs.append(subprocess.Popen(
                [os.path.join(bin_dir, "ddp-coordinator"), "--listen=" + a,
                 "--etcd_endpoints=" + ",".join(etcd.endpoints), "--etcd_prefix=" + prefix,
                 "--metrics_listen=", "--http_listen=", "--allow_anonymous_loopback",
                 "--output_root=" + os.path.realpath(tempfile.gettempdir())],
                stdout=log_file, stderr=subprocess.STDOUT, env=thread_env(),
                start_new_session=True))
            log_file.close()
            host, port = a.rsplit(":", 1)
            wait_listening(host, port, 30, "coordinator c%d to listen" % i, procs[-1])

        def sample():
            while not stop.is_set():
                r = etcd_revision(etcd.endpoints)
                if r is not None:
                    samples.append((time.time(), r, etcd_proposals(etcd.endpoints[0])))
                stop.wait(1.0)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.time()
        log("etcd load: %d simulated workers for %d s" % (args.load_workers, args.load_seconds))
        gen = subprocess.run([load_bin, "--coordinator=" + ",".join(addresses),
                              "--workers=%d" % args.load_workers,
                              "--loaded=%ds" % args.load_seconds],
                             capture_output=True, text=True, timeout=900, env=thread_env())
        t1 = time.time()
        stop.set()
        sampler.join(timeout=5)
        try:
            out["generator"] = json.loads(gen.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            out["generator"] = {"error": (gen.stderr or gen.stdout)[-2000:]}
        events = failover.etcd_history(etcd.endpoints, prefix, seconds=args.history_seconds)
        out["state_bytes"] = value_bytes(etcd.endpoints, prefix + "/state")
    finally:
        stop.set()
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        etcd.close()
    # The loaded phase is the generator's last --loaded seconds (then it
    # counts and prints): revisions per second over it, and over the run.
    load_end = t1 - 0.5
    load_start = load_end - args.load_seconds
    inside = [x for x in samples if load_start + 2 <= x[0] <= load_end]

    def rate(xs, k):
        if len(xs) < 2 or xs[-1][0] <= xs[0][0] or xs[0][k] is None or xs[-1][k] is None:
            return None
        return (xs[-1][k] - xs[0][k]) / (xs[-1][0] - xs[0][0])
    out["revisions_per_second_loaded"] = rate(inside, 1)
    out["revisions_per_second_whole"] = rate(samples, 1)
    # Every raft proposal etcd committed (lease grants and revocations too;
    # keep-alives are not proposals in etcd 3.4).
    out["proposals_per_second_loaded"] = rate(inside, 2)
    out["proposals_per_second_whole"] = rate(samples, 2)
    out["run_seconds"] = t1 - t0
    # Which keys were written, and how many transactions (a state write puts
    # PREFIX/state and PREFIX/writer in one transaction: one revision).
    by_key = {}
    revisions = set()
    for ev in events:
        key = ev["key"][len(prefix):]
        key = "/leader/<lease>" if key.startswith("/leader/") else key
        by_key[key] = by_key.get(key, 0) + 1
        revisions.add(ev["mod_revision"])
    out["events_by_key"] = by_key
    out["revisions_in_history"] = len(revisions)
    out["samples"] = samples
    out["command"] = ("/usr/bin/python3 bench/resilience.py --kinds etcd_load --load-workers %d "
                      "--load-seconds %d" % (args.load_workers, args.load_seconds))
    log("etcd load: %s revisions/s while loaded, %s over the whole run (%.0f s); events by key %s"
        % (fmt(out["revisions_per_second_loaded"], 1), fmt(out["revisions_per_second_whole"], 1),
           out["run_seconds"], by_key))
    return out


# ---- summaries and markdown ------------------------------------------------------------

def fmt(x, digits=2):
    return "—" if x is None else ("%.*f" % (digits, x))


def summarize(row, ttl, targets):
    injections = [i for r in row["runs"] for i in r["injections"]]
    kind = row["kind"]
    s = {"n": len(injections), "errors": [i["error"] for i in injections if i.get("error")]}
    s["new_leader"] = faults.summarize([i["new_leader_seconds"] for i in injections])
    s["leader_again"] = faults.summarize([i["leader_again_seconds"] for i in injections])
    s["old_stopped"] = faults.summarize([i["old_stopped_seconds"] for i in injections])
    s["back"] = faults.summarize([i["back_seconds"] for i in injections])
    s["changed"] = sum(1 for i in injections if i["leader_changed"])
    s["without_leader"] = faults.summarize([i["longest_without_leader"] for i in injections])
    s["longest_gap"] = faults.summarize([i["longest_gap_seconds"] for i in injections])
    s["steps_until_leader"] = faults.summarize([i["steps_until_leader"] for i in injections])
    median = statistics.median([r["median_step_seconds"] for r in row["runs"]]) if row["runs"] else 0
    quiet = max((r["quiet_longest_gap"] for r in row["runs"]), default=0.0)
    s["median_step"] = median
    s["quiet_gap"] = quiet
    # A pause: a gap between steps longer than 10 median steps (the
    # coordinator's own hang rule) and than the same run's longest gap away
    # from every fault (this shared machine's own hiccups).
    s["gap_threshold"] = max(10 * median, quiet)
    paused = [i for i in injections if i["longest_gap_seconds"] > s["gap_threshold"]]
    s["paused"] = len(paused)
    s["paused_steps"] = sum(max(0, round(i["longest_gap_seconds"] / median) - 1) for i in paused) \
        if median else 0
    s["reformations"] = sum(i["reformations"] for i in injections)
    s["steps_lost"] = sum(i["steps_lost"] for i in injections)
    s["causes"] = sorted({c for i in injections for c in i["causes"]})
    s["double_claims"] = sum(len(i["double_claims"]) for i in injections)
    s["duplicated"] = sum(r["samples"]["duplicated"] for r in row["runs"])
    s["skipped"] = sum(r["samples"]["skipped"] for r in row["runs"])
    s["padding"] = sum(r["samples"]["padding"] for r in row["runs"])
    s["terms"] = sum(len(r["terms"]) for r in row["runs"])
    s["problems"] = [p for r in row["runs"] for p in r["term_problems"]]
    s["states"] = [r["state"] for r in row["runs"]]
    s["crashed"] = [c for r in row["runs"] for c in r["crashed"]]
    s["left_behind"] = [(r["processes_left"], r["shm_left"]) for r in row["runs"]
                        if r["processes_left"] or r["shm_left"]]
    s["raft_leader_killed"] = sum(1 for i in injections if i.get("raft_leader"))
    median_t, max_t = targets
    missed = []
    if s["errors"]:
        missed.append("%d recoveries never came" % len(s["errors"]))
    times = s["new_leader"] if base_kind(kind) in LEADER_KINDS else (
        s["leader_again"] if kind == "etcd_down" else None)
    if times is not None and times.get("n"):
        if times["median"] > median_t or times["max"] > max_t:
            missed.append("time (median %.2f s, max %.2f s; target ≤ %.1f s / ≤ %.1f s)" % (
                times["median"], times["max"], median_t, max_t))
    if s["paused"] or s["reformations"] or s["steps_lost"]:
        missed.append("pause (%d of %d faults with a gap over %.3f s; %d re-formations, %d steps "
                      "lost)" % (s["paused"], s["n"], s["gap_threshold"], s["reformations"],
                                 s["steps_lost"]))
    if s["duplicated"] or s["skipped"]:
        missed.append("samples (%d duplicated, %d skipped)" % (s["duplicated"], s["skipped"]))
    if s["problems"]:
        missed.append("%d writes outside their writer's term" % len(s["problems"]))
    if any(st != "JOB_STATE_SUCCEEDED" for st in s["states"]):
        missed.append("job did not succeed: %s" % s["states"])
    if s["crashed"] or s["left_behind"]:
        missed.append("crashes or leftovers")
    s["missed"] = missed
    return s


def time_cell(kind, s):
    if base_kind(kind) in LEADER_KINDS:
        out = "%s / %s" % (fmt(s["new_leader"].get("median")), fmt(s["new_leader"].get("max")))
        if base_kind(kind) != "leader_kill9" and s["old_stopped"].get("n"):
            # A stopped leader answers its queued calls when continued; a
            # cut-off one stops claiming before its lease can expire.
            out += (" (the old leader's last answer as leader %s s median, %s s max after the "
                    "fault)" % (fmt(s["old_stopped"].get("median")), fmt(s["old_stopped"].get("max"))))
        return out
    if base_kind(kind) == "etcd_member":
        return ("leader unchanged in %d of %d (raft leader killed in %d); longest time with no "
                "coordinator answering as leader %s s%s" % (
                    s["n"] - s["changed"], s["n"], s["raft_leader_killed"],
                    fmt(s["without_leader"].get("max")),
                    ("; a new leader %s s median after the kill" % fmt(s["new_leader"]["median"]))
                    if s["changed"] and s["new_leader"].get("n") else ""))
    return ("the leader stopped leading %s s (median) into the outage, as it must (no renewal); "
            "a leader again %s / %s s after etcd was continued (the same coordinator in %d of %d)"
            % (fmt(s["old_stopped"].get("median")), fmt(s["leader_again"].get("median")),
               fmt(s["leader_again"].get("max")), s["n"] - s["changed"], s["n"]))


def target_cell(kind, targets):
    if base_kind(kind) in LEADER_KINDS:
        return "≤ %.1f s median, ≤ %.1f s max; 0 paused" % targets
    if kind == "etcd_down":
        return "a leader ≤ %.1f s / ≤ %.1f s after etcd returns (our reading); 0 paused" % targets
    return "0 paused"


def markdown(fo, baseline=None):
    """The lines of the failover section; `baseline`: the undisturbed
    loopback run of the rows above, for comparison."""
    L = ["## Coordinators that fail over", ""]
    m = fo["machine"]
    L.append("Written by `bench/resilience.py --kinds KIND,...` (module `bench/failover_faults.py`) "
             "in runs of their own, after the rows above; a run measures the kinds it names and "
             "keeps the other rows. Raw numbers: `docs/resilience.json` (`failover`).")
    L.append("")
    steps = [r["median_step_seconds"] for row in fo["rows"].values() for r in row["runs"]]
    base = (baseline or {}).get("median_step_seconds")
    L.append("**Machine:** the same (`nproc` %d, %s), shared with other engineers' builds and "
             "tests (load averages below), and each run here is itself nine processes on two "
             "cores (three etcd members, two coordinators, three workers) plus this script's "
             "poller%s." % (
                 m["nproc"], m["cpu"],
                 (": a median step of %.4f-%.4f s here, %.4f s in the undisturbed run above" % (
                     min(steps), max(steps), base)) if steps and base else ""))
    L.append("")
    L.append("**Measured** (etcd %s), in these runs; a row comes from the last run that named "
             "its kind:" % fo.get("etcd_version", "?"))
    L.append("")
    for k, inv in enumerate(fo["invocations"]):
        bi = inv["binaries"]
        kept = [kind for kind in inv["kinds"]
                if not any(kind in later["kinds"] for later in fo["invocations"][k + 1:])]
        L.append("- %s, `--kinds %s`, %.0f minutes, load average %.2f at the start, %.2f at the "
                 "end (rows here from it: %s): `ddp-coordinator` sha256 %s… (built %s), "
                 "`ddp-worker` sha256 %s… (built %s), HEAD %s%s." % (
                     inv["date"], ",".join(inv["kinds"]), inv["minutes"],
                     inv["machine"]["loadavg_start"][0], inv["machine"]["loadavg_end"][0],
                     ", ".join(kept) or "none",
                     bi["ddp-coordinator"]["sha256"], bi["ddp-coordinator"]["built"],
                     bi["ddp-worker"]["sha256"], bi["ddp-worker"]["built"], bi["head"],
                     (", with uncommitted changes to %s" % ", ".join(
                         "`%s`" % f for f in bi["uncommitted"])) if bi["uncommitted"] else ""))
    L.append("")
    L.append("**How:** per kind, one job (`chaos_job`, its epochs sized to the faults) on "
             "`tests/chaos/failover.py`'s `FailoverRun`: two coordinators (`--lease_ttl=%ds`, the "
             "default; renewals every sixth of it; a leader stops acting a tenth of the TTL "
             "before its lease could expire) on a 3-member etcd of its own "
             "(`tests/py/etcd_cluster.py`: heartbeat 50 ms, election 500 ms), three workers given "
             "both addresses, on loopback; for the partition, etcd, each coordinator and each "
             "worker in a network namespace of its own (`tests/py/netns.py`, "
             "`failover_netns_test`'s layout), the leader's path to etcd dropped silently both "
             "ways (`FailoverRun.cut_from_etcd`) while workers and the standby still reach it. The "
             "fault is caused %d times, each once the previous "
             "one recovered (a leader, the other coordinator its standby, three members "
             "training) and 20-80 more steps were trained; a killed coordinator is restarted with "
             "the same flags once a new leader answers. A poller calls every coordinator's "
             "`GetStatus` every 20 ms (a new call each tick): time to a new leader is from the "
             "signal to the first answer, to a call sent after it, in which the other coordinator "
             "says it leads itself (`leadership.is_leader`, `this_coordinator`). Steps paused: the "
             "longest gap between consecutive completed steps of one rank (within an epoch and a "
             "generation; `--metrics_file`) from the fault until the world was whole again + 1 s, "
             "against a threshold of the larger of 10 median steps and the same run's longest gap "
             "away from every fault; and every generation change then (a takeover adopts the "
             "running generation: `ADOPTED`, nothing lost). Terms: `failover.check_terms` over "
             "etcd's revision history of the job's prefix (`etcdctl watch --rev=1`): every state "
             "write made under the lease of the candidate that led at that revision, no two terms "
             "interleaved. Targets (the issue's): a new leader median ≤ %.1f s, max ≤ %.1f s; 0 "
             "steps paused; 0 overlapping terms; no sample duplicated or skipped." % (
                 fo["ttl"], fo["injections"], fo["targets"][0], fo["targets"][1]))
    L.append("")
    L.append("| fault | n | time to a new leader, median / max (s) | target | steps paused | "
             "samples duplicated / skipped | terms / writes outside a term | met? |")
    L.append("| --- | ---: | --- | --- | --- | --- | --- | --- |")
    for kind in KINDS:
        row = fo["rows"].get(kind)
        if row is None:
            continue
        if not row["runs"]:
            L.append("| %s | 0 | not measured: %s | | | | | |" % (DESCRIPTION[kind], row["skipped"]))
            continue
        s = row["summary"]
        paused = ("%s (%d of %d faults with a gap over %s s; longest %s s, median step %s s; "
                  "%d re-formations, %d steps lost%s)" % (
                      ("≈ %d steps' time" % s["paused_steps"]) if s["paused_steps"] else "0",
                      s["paused"], s["n"], fmt(s["gap_threshold"], 3),
                      fmt(s["longest_gap"].get("max"), 3), fmt(s["median_step"], 4),
                      s["reformations"], s["steps_lost"],
                      ("; changes: " + ", ".join(s["causes"])) if s["causes"] else ""))
        if s["steps_until_leader"].get("median"):
            paused += ("; median %d steps trained from the fault until a leader answered" %
                       s["steps_until_leader"]["median"])
        samples = "%d / %d (padding %d, apart)" % (s["duplicated"], s["skipped"], s["padding"])
        terms = "%d terms over %d run(s) / %d" % (s["terms"], len(row["runs"]), len(s["problems"]))
        if s["double_claims"]:
            terms += "; %d answers from a second coordinator saying it led" % s["double_claims"]
        verdict = "**met**" if not s["missed"] else "**missed**: " + "; ".join(s["missed"])
        L.append("| %s | %d | %s | %s | %s | %s | %s | %s |" % (
            DESCRIPTION[kind], s["n"], time_cell(kind, s), target_cell(kind, tuple(fo["targets"])),
            paused, samples, terms, verdict))
    L.append("")
    L.append("Each fault, in order (seconds to a new leader; etcd member: leader kept or changed; "
             "etcd down: seconds to a leader after etcd returned):")
    L.append("")
    for kind in KINDS:
        row = fo["rows"].get(kind)
        if not row or not row["runs"]:
            continue
        items = []
        for r in row["runs"]:
            for i in r["injections"]:
                if base_kind(kind) in LEADER_KINDS:
                    items.append(fmt(i["new_leader_seconds"]))
                elif base_kind(kind) == "etcd_member":
                    items.append(("changed" if i["leader_changed"] else "kept") +
                                 ("*" if i.get("raft_leader") else ""))
                else:
                    items.append(fmt(i["leader_again_seconds"]))
        L.append("- %s: %s" % (kind, ", ".join(items)))
    if "etcd_member" in fo["rows"] and fo["rows"]["etcd_member"]["runs"]:
        L.append("")
        L.append("\\* the member killed was etcd's raft leader.")
    L.append("")
    L.append("### Beside each row: Kubernetes-style leader election and torchelastic's etcd "
             "rendezvous, from their documentation")
    L.append("")
    L.append("Kubernetes: client-go's `leaderelection` with the defaults of kube-controller-manager "
             "and kube-scheduler (lease 15 s, renew deadline 10 s, retry period 2 s). torchelastic: "
             "`torchrun --rdzv-backend=etcd` (`EtcdRendezvousHandler`). Not measured here.")
    L.append("")
    L.append("| fault | ours (measured above) | Kubernetes-style leader election | torchelastic etcd "
             "rendezvous |")
    L.append("| --- | --- | --- | --- |")
    for kind in KINDS:
        row = fo["rows"].get(kind)
        if row is None or base_kind(kind) != kind:  # the others' behaviour is the base kind's
            continue
        s = row.get("summary")
        if not s:
            ours = "not measured"
        elif base_kind(kind) in LEADER_KINDS:
            ours = "a new leader in %s s median, %s s max; training never paused; %d steps lost" % (
                fmt(s["new_leader"].get("median")), fmt(s["new_leader"].get("max")),
                s["steps_lost"])
        elif base_kind(kind) == "etcd_member":
            ours = "leader kept in %d of %d%s; training never paused; %d steps lost" % (
                s["n"] - s["changed"], s["n"],
                (" (a takeover %s s after the kill in the rest)" % fmt(s["new_leader"]["median"]))
                if s["changed"] and s["new_leader"].get("n") else "", s["steps_lost"])
        else:
            ours = ("no leader while etcd is down; one again %s s median after it returns; "
                    "training goes on throughout, %d steps lost" % (
                        fmt(s["leader_again"].get("median")), s["steps_lost"]))
        if s and s["paused"]:
            ours = ours.replace("training never paused", "%d pause(s)" % s["paused"])
        L.append("| %s | %s | %s | %s |" % (DESCRIPTION[kind], ours, KUBERNETES[kind],
                                            TORCHELASTIC[kind]))
    L.append("")
    obs = [o for k in KINDS if k in fo["rows"] for o in observations(k, fo["rows"][k])]
    if obs:
        L.append("### Observations")
        L.append("")
        for o in obs:
            L.append("- " + o)
        L.append("")
    load = fo.get("etcd_load")
    if load:
        L.extend(load_markdown(load))
    missed = [(k, fo["rows"][k]["summary"]) for k in KINDS
              if k in fo["rows"] and fo["rows"][k].get("summary", {}).get("missed")]
    L.append("### Failover targets missed")
    L.append("")
    if not missed:
        L.append("None.")
    for kind, s in missed:
        L.append("- **%s**: %s." % (DESCRIPTION[kind], "; ".join(s["missed"])))
        for line in fo["rows"][kind].get("analysis", []):
            L.append("  " + line)
    skipped = [(k, fo["rows"][k]["skipped"]) for k in KINDS
               if k in fo["rows"] and fo["rows"][k]["skipped"]]
    if skipped:
        L.append("")
        L.append("Rows cut short or not measured: %s." % "; ".join("%s: %s" % x for x in skipped))
    L.append("")
    return L


def load_markdown(load):
    g = load.get("generator", {})
    L = ["### etcd load at %s simulated workers" % "{:,}".format(load["workers"]), ""]
    rate = load.get("revisions_per_second_loaded")
    keys = ", ".join("`%s` %d" % (k, v) for k, v in sorted(load["events_by_key"].items(),
                                                            key=lambda kv: -kv[1]))
    L.append("`bench/load_generator.cc` (`ddp_load_generator --workers=%d --loaded=%ds`, reports "
             "batched every 100 ms, 10 steps a second each, heartbeats every second) against two "
             "coordinators on a one-member etcd; etcd's revision (one per write transaction: a "
             "state write puts `PREFIX/state` and `PREFIX/writer` in one) sampled every second. "
             "While loaded: **%s writes/s** (target < 50; raft proposals committed %s/s, lease "
             "grants included); over the whole run, registration and the %s-member generation's "
             "forming included, %s/s (%.0f s). Lease keep-alives (each coordinator every sixth of "
             "the TTL) write no revision. The state a write puts is %s bytes with the "
             "%s-member generation in it. What was written, "
             "from etcd's history of the prefix: %s (%d write transactions in all). The generator "
             "saw: %s reports/s, %s heartbeats/s, job `%s`, %s attached, %s lost. Reproduce: `%s`."
             % (load["workers"], load["loaded_seconds"], fmt(rate, 1),
                fmt(load.get("proposals_per_second_loaded"), 1), "{:,}".format(load["workers"]),
                fmt(load.get("revisions_per_second_whole"), 1), load["run_seconds"],
                "{:,}".format(load["state_bytes"]) if load.get("state_bytes") else "?",
                "{:,}".format(load["workers"]), keys,
                load["revisions_in_history"], g.get("reports_per_s", "?"),
                g.get("heartbeats_per_s", "?"), g.get("job_state", "?"), g.get("attached", "?"),
                g.get("lost", "?"), load["command"]))
    L.append("")
    met = rate is not None and rate < 50
    L.append("%s Why so few: the leader saves its state on events (a generation formed, a pause "
             "ended, an epoch's or a checkpoint's result, a fault; `PersistLocked` in "
             "`coordinator/coordinator*.cc`) and the committed step at most every 5 s (the sweep "
             "in `coordinator_faults.cc`), never per step report or heartbeat; and `StateWriter` "
             "keeps one write in flight, the newest state replacing any queued, so the 1,000 "
             "members' state changes of a forming generation are a few writes, not 1,000. The "
             "bound is then about one write per event plus 0.2/s, whatever the number of "
             "workers; what grows with them is each write's size (above)." % (
                 "**met**." if met else "**missed**."))
    L.append("")
    return L


def render_prepare(fo):
    """Summaries of every failover row (after a run or a reanalysis)."""
    for kind, row in fo["rows"].items():
        if row["runs"]:
            row["summary"] = summarize(row, fo["ttl"], tuple(fo["targets"]))
            row["analysis"] = explain(kind, row) if row["summary"]["missed"] else []


def explain(kind, row):
    """Where the time went for a missed target, in words, from the numbers."""
    s = row["summary"]
    injections = [i for r in row["runs"] for i in r["injections"]]
    out = []
    paused = [i for i in injections if i["longest_gap_seconds"] > s["gap_threshold"]]
    for i in paused:
        ranks = i.get("longest_gap_ranks") or {}
        own = {n: sum((r.get(k) or 0) for k in ("data_ms", "forward_ms", "backward_ms",
                                                 "optimizer_ms")) for n, r in ranks.items()}
        out.append("%s at step %s: a gap of %.3f s (%s, %.2f s after the fault); in the step that "
                   "ended it each rank's own compute was %s and its all-reduce wait %s%s." % (
                       i["victim"], i["step"], i["longest_gap_seconds"], i["longest_gap_at"][0],
                       i["longest_gap_at"][2],
                       ", ".join("%s %.1f ms" % (n, own[n]) for n in sorted(own)),
                       ", ".join("%s %.1f ms" % (n, ranks[n].get("wait_ms") or 0)
                                 for n in sorted(ranks)),
                       ("; the coordinators logged: " + "; ".join(
                           "%s at %+.2f s: %s" % tuple(x) for x in i.get("leadership_log", [])))
                       if i.get("leadership_log") else ""))
        if i.get("longest_gap_cpu"):
            out.append("  Cores each process had in the half second around that gap: %s (over "
                       "the whole run: %s)." % (
                           ", ".join("%s %.2f" % kv for kv in i["longest_gap_cpu"].items()),
                           ", ".join("%s %.2f" % kv for kv in row_cpu(row).items())))
    deposed = []
    for i in paused:
        gone = {x[0] for x in i.get("leadership_log", []) if "no longer the leader" in x[2]}
        cpu = i.get("longest_gap_cpu") or {}
        if gone and max(cpu.get(c, 0) for c in gone) >= 0.5:
            deposed.append((i, max(gone, key=lambda c: cpu.get(c, 0))))
    if paused and len(deposed) == len(paused):
        run_cpu = row_cpu(row)
        coords = [cpu_of for cpu_of in (i["longest_gap_cpu"].get(c) for i, c in deposed)]
        workers = [v for i, _ in deposed for n, v in i["longest_gap_cpu"].items()
                   if n.startswith("w")]
        out.append(
            "In each, the coordinator that had just stepped down used %.2f-%.2f of a core around "
            "the gap (%.2f over the run) and each worker %.2f-%.2f (%.2f over the run): the "
            "workers were short of CPU, and the deposed coordinator had it." % (
                min(coords), max(coords), run_cpu.get(deposed[0][1], 0), min(workers),
                max(workers), statistics.median([v for n, v in run_cpu.items()
                                                 if n.startswith("w")] or [0])))
    elif paused:
        out.append("Small own compute on every rank and a long all-reduce wait mean a rank came "
                   "late to the collective: not running, or busy outside the step's timers. A "
                   "worker never waits on a coordinator within a step (the coordinator SIGSTOP "
                   "row above: stopped 4 s, no gap); the cores each process had (a core's worth "
                   "is 1.00; the machine has %d, shared with other engineers' work) show who "
                   "ran instead. The run's own longest gap away from the faults was %.3f s." % (
                       os.cpu_count() or 2, s["quiet_gap"]))
    slow = sorted((i for i in injections if base_kind(kind) in LEADER_KINDS and
                   (i.get("new_leader_seconds") or 0) > 3.5), key=lambda i: -i["new_leader_seconds"])
    for i in slow[:4]:
        out.append("%s at step %s: a new leader after %.2f s; the coordinators logged: %s." % (
            i["victim"], i["step"], i["new_leader_seconds"],
            "; ".join("%s at %+.2f s: %s" % tuple(x) for x in i.get("leadership_log", []))))
    for e in s["errors"][:3]:
        out.append("Recovery never came: " + e)
    return out


def row_cpu(row):
    runs = [r.get("run_cpu") or {} for r in row["runs"]]
    names = sorted({n for r in runs for n in r})
    return {n: round(statistics.median([r[n] for r in runs if n in r]), 2) for n in names}


def observations(kind, row):
    """What is worth saying of a row even where every target was met."""
    s = row.get("summary")
    if not s:
        return []
    injections = [i for r in row["runs"] for i in r["injections"]]
    out = []
    if base_kind(kind) == "etcd_member" and s["changed"]:
        changed = [i for i in injections if i["leader_changed"]]
        losses = [x for i in changed for x in i.get("leadership_log", [])
                  if "no longer the leader" in x[2]]
        out.append(
            "etcd member lost: the coordinator leader stepped down in %d of %d faults, each when "
            "the member killed was etcd's raft leader (%d of %d such kills)%s. Lease keep-alives "
            "go to etcd's raft leader; its election (election timeout 500 ms in this fixture; "
            "etcd's default is 1 s) plus the time since the last renewal (up to a sixth of the "
            "TTL) outlasted the TTL - TTL/10 = %.1f s after its last confirmed renewal at which a "
            "leader stops acting. The standby led %s s (median) after the kill. Training went on "
            "(the takeover adopted the generation, 0 steps lost) and no term overlapped another. "
            "Riding out etcd's default 1 s election timeout (1-2 s elections) every time needs a "
            "longer --lease_ttl (3 s), at about 0.7 s more per takeover after a crash." % (
                len(changed), s["n"], sum(1 for i in changed if i.get("raft_leader")),
                s["raft_leader_killed"],
                (" (\"%s\", %s s after the kill)" % (
                    losses[0][2].split(";")[0], "/".join("%.2f" % x[1] for x in losses)))
                if losses else "", 0.9 * row["runs"][0].get("lease_ttl", 2),
                fmt(s["new_leader"].get("median"))))
    if kind == "etcd_down" and s["n"]:
        out.append(
            "etcd down: the leader stopped acting %s s (median) after etcd stopped answering, "
            "before its lease could expire, and executed itself again as a standby; its campaign "
            "then retried with a backoff (200 ms doubling up to 5 s). When etcd ran again every "
            "lease had expired, and whichever coordinator stood again first led, %s s (median) "
            "after etcd was continued: mostly the standby, whose renewal loop found its lease "
            "gone and stood at once (the same coordinator led again in %d of %d). Training went on "
            "throughout: %d steps (median) from the fault until a leader answered." % (
                fmt(s["old_stopped"].get("median")), fmt(s["leader_again"].get("median")),
                s["n"] - s["changed"], s["n"], s["steps_until_leader"].get("median", 0)))
    return out
def reanalyze(fo, kinds=None):
    for kind, row in fo["rows"].items():
        if kinds is not None and kind not in kinds:
            continue
        runs = []
        for r in row["runs"]:
            files = chaos.RunFiles(r["dir"], r["job"])
            res = analyze(files, [injection_from(d) for d in r["raw_injections"]], r["final"])
            for k in ("terms", "term_problems", "history_events", "epochs", "lease_ttl",
                      "crashed", "processes_left", "shm_left"):
                if k in r:
                    res[k] = r[k]
            runs.append(res)
        row["runs"] = runs
        row["reanalyzed"] = time.strftime("%Y-%m-%d")
