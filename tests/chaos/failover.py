"""Coordinators that fail over to each other through a real etcd: a chaos
run with several ddp-coordinator processes (c0, c1, ...) on one etcd
cluster, workers given all their addresses, and the checks of leadership:
who leads, how soon a standby took over, and a Jepsen-style check of etcd's
revision history that no two leadership terms overlap in their writes."""
import base64
import json
import os
import subprocess
import time

import grpc

import chaos
from grpc_reflect import ReflectionClient
from harness import free_port, wait_for, wait_listening


class FailoverRun(chaos.ChaosRun):
    """A job on `coordinators` coordinators sharing `etcd` (an EtcdCluster)
    under their own prefix, and `workers` workers following the leader.

    On loopback, or with `net` (a netns.Network) in its hosts: etcd's where
    the EtcdCluster put them (host 0, say), worker i on host i + 1 (as in
    ChaosRun), coordinator c<k> on host workers + 1 + k, each listening on
    its host's address (--insecure, as ChaosRun's with a net)."""

    def __init__(self, job, etcd, coordinators=2, workers=3, lease_ttl=2, extra_coordinator=(),
                 net=None):
        self.etcd = etcd
        self.lease_ttl = lease_ttl
        self.prefix = "/ddp/" + job["name"]
        if net is None:
            self.coordinator_hosts = [None] * coordinators
            self.addresses = ["127.0.0.1:%d" % free_port() for _ in range(coordinators)]
        else:
            self.coordinator_hosts = [workers + 1 + k for k in range(coordinators)]
            if self.coordinator_hosts[-1] >= len(net.hosts):
                raise ValueError("%d workers and %d coordinators need %d hosts, the network has "
                                 "%d" % (workers, coordinators, self.coordinator_hosts[-1] + 1,
                                         len(net.hosts)))
            self.addresses = ["%s:29400" % net.hosts[h].ip for h in self.coordinator_hosts]
        self.clients = {}
        self.failover_flags = [
            "--etcd_endpoints=" + ",".join(etcd.endpoints), "--etcd_prefix=" + self.prefix,
            "--lease_ttl=%ds" % lease_ttl, "--metrics_listen=", "--http_listen="]
        if net is None:
            # What is under test is failover, not authentication (auth_test).
            self.failover_flags.append("--allow_anonymous_loopback")
        super().__init__(job, workers, net=net, extra_coordinator=extra_coordinator)

    # ---- processes -------------------------------------------------------

    def coordinator_names(self):
        return ["c%d" % i for i in range(len(self.addresses))]

    def start_coordinator(self):
        # The base run's flags, less its single address and state folder.
        self.target = ",".join(self.addresses)
        for i in range(len(self.addresses)):
            self.start_one(i)

    def start_one(self, i):
        """Starts (or restarts) coordinator c<i>; returns once it listens."""
        base = [a for a in self.coordinator_args
                if not a.startswith("--listen=") and not a.startswith("--state_dir=")]
        args = base + ["--listen=" + self.addresses[i]] + self.failover_flags
        p = self._start("c%d" % i, args, host=self.coordinator_hosts[i])
        host, port = self.addresses[i].rsplit(":", 1)
        wait_listening(host, port, 30, "coordinator c%d to listen" % i, p)
        old = self.clients.pop(i, None)
        if old is not None:
            old.close()
        return p

    def status_target(self):
        return self.addresses[0]

    # ---- partitions (with a net) ------------------------------------------

    def cut_from_etcd(self, i):
        """Parts c<i> from every etcd member, silently both ways, and from
        nothing else: workers and the other coordinators still reach it."""
        self.events.append((time.time(), "c%d cut from etcd" % i))
        for h in self._etcd_hosts():
            self.net.cut_between(self.coordinator_hosts[i], h)

    def heal_from_etcd(self, i):
        for h in self._etcd_hosts():
            self.net.heal_between(self.coordinator_hosts[i], h)
        self.events.append((time.time(), "c%d back to etcd" % i))

    def _etcd_hosts(self):
        hosts = sorted(set(self.etcd.member_hosts))
        if self.net is None or None in hosts:
            raise ValueError("cutting from etcd needs the run and etcd in a Network")
        return hosts

    def client_of(self, i):
        if i not in self.clients:
            self.clients[i] = ReflectionClient(self.addresses[i])
        return self.clients[i]

    # ---- observing -------------------------------------------------------

    def status(self):
        """GetStatus from any coordinator that answers (standbys forward)."""
        last = None
        for i in range(len(self.addresses)):
            try:
                return self.client_of(i).call("ddp.v1.Coordinator/GetStatus", timeout=2)
            except grpc.RpcError as e:  # down, or a standby with no leader yet
                last = e
        raise last

    def leadership_of(self, i):
        """What c<i> itself says of leadership, or None when it can't say."""
        try:
            s = self.client_of(i).call("ddp.v1.Coordinator/GetStatus", timeout=1)
        except grpc.RpcError:
            # A fresh channel next time: this one may be backing off.
            self.clients.pop(i).close()
            return None
        return s.get("leadership")

    def leader(self):
        """The index of the leading coordinator, as the one answering says."""
        lead = self.status().get("leadership", {}).get("leader")
        return self.addresses.index(lead) if lead in self.addresses else None

    def wait_leader(self, i, timeout):
        """Until c<i> says it leads; returns the time it was first seen so."""
        def leads():
            own = self.leadership_of(i)
            return own is not None and own.get("is_leader") and \
                own.get("this_coordinator") == self.addresses[i]
        wait_for(leads, timeout, "c%d to lead" % i, interval=0.02)
        return time.time()

    def health(self, i, service=""):
        """grpc.health.v1 as c<i> answers it for `service`."""
        return self.client_of(i).call("grpc.health.v1.Health/Check",
                                      json.dumps({"service": service}), timeout=2).get("status")

    def watch_through(self, i, count=2):
        """The first `count` statuses of a WatchStatus sent to c<i>."""
        call, request, _ = self.client_of(i).stub("ddp.v1.Coordinator/WatchStatus")
        stream = call(request(interval_seconds=0.1), timeout=10)
        out = []
        for status in stream:
            out.append(ReflectionClient.to_dict(status))
            if len(out) == count:
                stream.cancel()
                break
        return out

    def wait_refusal_naming(self, i, leader, timeout=15):
        """Until c<i> refuses a mutation naming `leader` in its trailer."""
        wait_for(lambda: (lambda r: r[0] == grpc.StatusCode.UNAVAILABLE and r[2] == leader)(
            self.refusal(i)), timeout, "c%d to refuse naming %s" % (i, leader), interval=0.05)

    def refusal(self, i):
        """(code, details, leader trailer) of a mutation sent to c<i>."""
        try:
            self.client_of(i).call("ddp.v1.Coordinator/CancelJob",
                                   json.dumps({"job_id": "no-such-job"}), timeout=2)
        except grpc.RpcError as e:
            trailer = dict(e.trailing_metadata() or ()).get("ddp-leader")
            if trailer is None:
                # Not an answer from c<i> (it is not up yet): a fresh
                # channel next time, not one backing off for seconds.
                stale = self.clients.pop(i, None)
                if stale is not None:
                    stale.close()
            return e.code(), e.details(), trailer
        return grpc.StatusCode.OK, "", None

    def close(self):
        for c in self.clients.values():
            c.close()
        self.clients = {}
        super().close()


# ---- the history of terms -------------------------------------------------

def etcd_history(endpoints, prefix, seconds=3):
    """Every event under `prefix` since revision 1, from etcd itself
    (etcdctl watch --rev=1 replays the history, then waits: stopped after
    `seconds`)."""
    try:
        out = subprocess.run(
            ["etcdctl", "--endpoints=" + ",".join(endpoints), "watch", "--prefix", prefix + "/",
             "--rev=1", "-w", "json"],
            capture_output=True, timeout=seconds, env=dict(os.environ, ETCDCTL_API="3"))
        text = out.stdout
    except subprocess.TimeoutExpired as e:
        text = e.stdout or b""
    events = []
    for line in text.decode(errors="replace").splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        for ev in json.loads(line).get("Events") or []:
            kv = ev["kv"]
            events.append({
                "type": "DELETE" if ev.get("type") == 1 else "PUT",
                "key": base64.b64decode(kv["key"]).decode(),
                "value": base64.b64decode(kv.get("value", "")).decode(errors="replace"),
                "create_revision": int(kv.get("create_revision", 0)),
                "mod_revision": int(kv.get("mod_revision", 0)),
                "lease": int(kv.get("lease", 0))})
    return events


def check_terms(events, prefix):
    """Proves from the history that every state write was made by the leader
    of that moment and that no two terms overlap in their writes. Returns
    (terms, problems): terms as [(lease hex, first write revision, last write
    revision, writes)] in order, and a list of what is wrong (empty: none)."""
    candidates = prefix + "/leader/"
    alive = {}  # key -> (create revision, lease hex)
    born, died = {}, {}
    problems, writes = [], []
    for ev in sorted(events, key=lambda e: e["mod_revision"]):
        key, rev = ev["key"], ev["mod_revision"]
        if key.startswith(candidates):
            lease = key[len(candidates):]
            if ev["type"] == "PUT":
                born.setdefault(lease, rev)
                alive[key] = (ev["create_revision"], lease)
            else:
                died[lease] = rev
                alive.pop(key, None)
        elif key == prefix + "/writer":
            leader = min(alive.values()) if alive else None
            writes.append((rev, ev["value"]))
            if leader is None or leader[1] != ev["value"]:
                problems.append("revision %d written under lease %s while %s led" % (
                    rev, ev["value"], leader[1] if leader else "no one"))
    terms = []
    for rev, lease in writes:
        if terms and terms[-1][0] == lease:
            terms[-1] = (lease, terms[-1][1], rev, terms[-1][3] + 1)
        else:
            terms.append((lease, rev, rev, 1))
    seen = set()
    for lease, _, _, _ in terms:
        if lease in seen:
            problems.append("lease %s wrote again after another term had written" % lease)
        seen.add(lease)
    for lease, first, last, _ in terms:
        if lease in died and last >= died[lease]:
            problems.append("lease %s wrote at %d after its key went at %d" % (
                lease, last, died[lease]))
    return terms, problems
