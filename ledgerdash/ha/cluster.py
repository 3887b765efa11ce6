"""A PostgreSQL cluster that fails over, on one machine: etcd, and two
PostgreSQL servers each run by Patroni, the second a synchronous standby
of the first (an acknowledged commit is on both), all from Debian's
packages (``patroni``, ``etcd-server``, ``postgresql``).

For the failover drill and for trying a deployment out; production runs
one Patroni per host and three etcd members (docs/production.md, "High
availability"; ``deploy/ha/patroni.yml``). Standard library only, so it
runs before Django is set up and from ``deploy/ha/cluster``::

    python -m ledgerdash.ha.cluster start DIR [--base-port 25400]   # prints the app's DATABASE_URL
    python -m ledgerdash.ha.cluster status DIR
    python -m ledgerdash.ha.cluster stop DIR

Ports, from the base port P: etcd's clients P and peers P+1; node N's
PostgreSQL P+10+N and its Patroni REST API P+20+N. Everything lives in DIR
(data, configuration, logs). As root, PostgreSQL and Patroni run as the
``postgres`` OS user (initdb refuses root).

The drill's faults act on a node as a host failure would: :meth:`Cluster.kill`
SIGKILLs its Patroni and every PostgreSQL process (a host that dies);
:meth:`Cluster.freeze` SIGSTOPs them (a host that hangs, its clients'
connections left open) and :meth:`Cluster.thaw` lets them go on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCOPE = "ledgerdash"
#: Patroni's timing (seconds): the leader key lives ``ttl`` after its last
#: renewal, so a dead or frozen primary is replaced about ``ttl`` after it
#: stopped; ``loop_wait`` between Patroni's checks. Production keeps
#: Patroni's defaults (30, 10, 10) unless its network is as quiet as this.
TTL, LOOP_WAIT, RETRY_TIMEOUT = 10, 1, 3


class ClusterError(RuntimeError):
    """The cluster could not be started or did not reach the state waited for."""


def pg_bin() -> Path:
    """The newest PostgreSQL server binaries Debian installed (PG_BIN overrides)."""
    given = os.environ.get("PG_BIN")
    if given:
        return Path(given)
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parent.parent.name))
    if not versions:
        raise ClusterError("no PostgreSQL server under /usr/lib/postgresql: install Debian's postgresql package")
    return versions[-1].parent


def missing_programs() -> list[str]:
    """Debian packages the cluster needs that are not installed."""
    needed = {"patroni": "patroni", "etcd": "etcd-server"}
    missing = [package for program, package in needed.items() if shutil.which(program) is None]
    try:
        pg_bin()
    except ClusterError:
        missing.append("postgresql")
    return missing


def _program(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ClusterError(f"{name} is not installed (see missing_programs)")
    return found


def patroni_version() -> tuple[int, ...]:
    done = subprocess.run([_program("patroni"), "--version"], capture_output=True, text=True, check=False)  # noqa: S603
    words = done.stdout.split()
    try:
        return tuple(int(part) for part in words[-1].split("."))
    except (IndexError, ValueError):
        return (0,)


#: Patroni before 3.0.3, with etcd's v3 API, may overwrite a new leader's key
#: when a primary that froze past its lease comes back: its heartbeat takes a
#: fresh lease and writes the key unconditionally (fixed by
#: patroni/patroni#2689). Both primaries then take writes for a moment and
#: the new one's are rewound away. The failover drill's freeze finds this
#: (its probe's acknowledged writes go missing). Those versions (Debian 12
#: ships 3.0.2) use etcd's v2 API instead, whose leader update is a
#: compare-and-swap on the leader's name.
ETCD3_SAFE_FROM = (3, 0, 3)


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base_port(start: int = 25400, *, span: int = 30, tries: int = 200) -> int:
    """A base port whose whole span is free, from ``start`` up in steps of
    ``span``, beginning at a step chosen by this process's id (clusters
    started side by side rarely try the same span first)."""
    for n in range(tries):
        base = start + ((os.getpid() + n) % tries) * span
        if all(_free(base + offset) for offset in range(span)):
            return base
    raise ClusterError(f"no {span} free ports from {start}")


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running (not a zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _runs(pid: int, marker: str) -> bool:
    """Whether ``pid`` is a live process whose command line names ``marker``
    (a node's data folder or configuration): a pid read from a file may
    since belong to another process."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return _alive(pid) and marker in cmdline


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _http_json(url: str, timeout: float = 1.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 - our own local Patroni
            return json.load(answer)
    except urllib.error.HTTPError as exc:  # Patroni answers some checks with 503 and a body
        return json.load(exc)


@dataclass
class Node:
    name: str
    pg_port: int
    rest_port: int
    home: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def config(self) -> Path:
        return self.home / "patroni.yml"

    def postmaster(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def patroni(self) -> int | None:
        """Its Patroni's pid: the process this run started, or the one a
        ``start`` in another process wrote down, if it still runs this node's configuration."""
        if self.proc is not None:
            return self.proc.pid if self.proc.poll() is None else None
        try:
            pid = int((self.home / "patroni.pid").read_text())
        except (OSError, ValueError):
            return None
        return pid if _runs(pid, str(self.config)) else None

    def processes(self) -> list[int]:
        """Its Patroni and every PostgreSQL process, the postmaster first
        (each checked to be this node's, not a process that took a stale pid)."""
        pids: list[int] = []
        postmaster = self.postmaster()
        if postmaster and _runs(postmaster, str(self.data)):
            pids += process_tree(postmaster)
        patroni = self.patroni()
        if patroni:
            pids += [pid for pid in process_tree(patroni) if pid not in pids]
        return pids


class Cluster:
    """Two (or more) Patroni-run PostgreSQL servers and one etcd, under ``root``."""

    def __init__(self, root: Path, base_port: int, *, nodes: int = 2) -> None:
        self.root = Path(root).resolve()
        self.base = base_port
        self.etcd: subprocess.Popen[bytes] | None = None
        self.nodes = [
            Node(f"node{n}", base_port + 10 + n, base_port + 20 + n, self.root / f"node{n}")
            for n in range(1, nodes + 1)
        ]
        self._run_as = self._postgres_user() if os.geteuid() == 0 else None
        self.etcd_api = "etcd3" if patroni_version() >= ETCD3_SAFE_FROM else "etcd"

    # -- what the app connects to ---------------------------------------------------------------

    def url(self, dbname: str = "postgres", user: str = "postgres", *, connect_timeout: int = 3) -> str:
        """A libpq multi-host URL that finds the writable server wherever it is."""
        hosts = ",".join(f"127.0.0.1:{node.pg_port}" for node in self.nodes)
        return f"postgres://{user}@{hosts}/{dbname}?target_session_attrs=read-write&connect_timeout={connect_timeout}"

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    # -- starting and stopping ------------------------------------------------------------------

    @staticmethod
    def _postgres_user() -> pwd.struct_passwd:
        try:
            return pwd.getpwnam("postgres")
        except KeyError:
            raise ClusterError(
                "running as root needs a postgres OS user (Debian's postgresql package makes it)"
            ) from None

    def _reachable(self) -> None:
        """As root, PostgreSQL and Patroni run as the postgres OS user: every
        folder above ``root`` must let it through."""
        if not self._run_as:
            return
        for parent in self.root.parents:
            mode = parent.stat()
            if mode.st_uid != self._run_as.pw_uid and not mode.st_mode & 0o001:
                raise ClusterError(
                    f"the postgres OS user cannot reach {self.root}: {parent} is mode {mode.st_mode & 0o777:o}; "
                    "put the cluster in a folder others may pass through (such as a new folder in /tmp)"
                )

    def _own(self, path: Path) -> None:
        if self._run_as:
            for entry in [path, *path.rglob("*")]:
                os.chown(entry, self._run_as.pw_uid, self._run_as.pw_gid)

    def start(self, *, timeout: float = 120.0) -> None:
        """etcd, then the first node (which initialises the cluster), then the
        others; returns once there is a leader and a synchronous standby."""
        missing = missing_programs()
        if missing:
            raise ClusterError(f"the cluster needs Debian's {', '.join(missing)} (apt-get install {' '.join(missing)})")
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        self._reachable()
        (self.root / "cluster.json").write_text(
            json.dumps({"base_port": self.base, "nodes": len(self.nodes), "url": self.url()})
        )
        self._start_etcd()
        first = self.nodes[0]
        for node in self.nodes:
            self._write_config(node)
            self.start_node(node)
            if node is first:
                self.wait_for(lambda: self.leader() == first.name, timeout, f"{first.name} to lead")
        self.wait_for(lambda: self.sync_standby() is not None, timeout, "a synchronous standby")

    def _start_etcd(self) -> None:
        home = self.root / "etcd"
        home.mkdir(exist_ok=True)
        client, peer = f"http://127.0.0.1:{self.base}", f"http://127.0.0.1:{self.base + 1}"
        with (home / "etcd.log").open("ab") as log:
            self.etcd = subprocess.Popen(  # noqa: S603 - Debian's etcd, fixed arguments
                [
                    _program("etcd"),
                    "--name=etcd1",
                    f"--data-dir={home / 'data'}",
                    f"--listen-client-urls={client}",
                    f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=etcd1={peer}",
                    "--initial-cluster-state=new",
                    *(["--enable-v2=true"] if self.etcd_api == "etcd" else []),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        (home / "etcd.pid").write_text(str(self.etcd.pid))

        def answers() -> bool:
            try:
                return _http_json(f"{client}/health").get("health") == "true"
            except (OSError, ValueError):
                return False

        self.wait_for(answers, 30, "etcd to answer")

    def _write_config(self, node: Node) -> None:
        node.home.mkdir(parents=True, exist_ok=True)
        node.home.chmod(0o700)
        hba = ["local all all trust", "host replication all 127.0.0.1/32 trust", "host all all 127.0.0.1/32 trust"]
        config = {
            "scope": SCOPE,
            "name": node.name,
            "log": {"level": "INFO", "dir": str(node.home), "file_num": 2},
            "restapi": {
                "listen": f"127.0.0.1:{node.rest_port}",
                "connect_address": f"127.0.0.1:{node.rest_port}",
            },
            self.etcd_api: {"hosts": f"127.0.0.1:{self.base}"},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL,
                    "loop_wait": LOOP_WAIT,
                    "retry_timeout": RETRY_TIMEOUT,
                    # Only the synchronous standby, which has every acknowledged
                    # commit, may be promoted.
                    "synchronous_mode": True,
                    "maximum_lag_on_failover": 1048576,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "synchronous_commit": "on",
                            "wal_level": "replica",
                            "wal_log_hints": "on",
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "hot_standby": "on",
                            "max_connections": 100,
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}, "data-checksums"],
                "pg_hba": hba,
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.pg_port}",
                "connect_address": f"127.0.0.1:{node.pg_port}",
                "data_dir": str(node.data),
                "bin_dir": str(pg_bin()),
                "pgpass": str(node.home / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                    "rewind": {"username": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(node.home)},
                "pg_hba": hba,
                # A node that comes back after failing over rejoins as a standby;
                # when its history cannot be rewound it starts afresh from the leader.
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
            "tags": {"nofailover": False, "noloadbalance": False},
        }
        node.config.write_text(json.dumps(config, indent=2))  # JSON is YAML
        self._own(node.home)

    def start_node(self, node: Node) -> None:
        """Start (or restart after :meth:`kill`) the node's Patroni, which starts its PostgreSQL."""
        postmaster = node.postmaster()
        if postmaster and not _alive(postmaster):
            # A killed postmaster's lock file names a process that is gone (or a
            # zombie nobody reaped, which PostgreSQL would take for a live one).
            (node.data / "postmaster.pid").unlink(missing_ok=True)
        kwargs: dict[str, Any] = {}
        if self._run_as:
            kwargs = {"user": self._run_as.pw_uid, "group": self._run_as.pw_gid, "extra_groups": []}
        with (node.home / "patroni.out").open("ab") as out:
            node.proc = subprocess.Popen(  # noqa: S603 - Debian's patroni, our configuration
                [_program("patroni"), str(node.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=node.home,
                env={**os.environ, "HOME": str(node.home)},
                **kwargs,
            )
        (node.home / "patroni.pid").write_text(str(node.proc.pid))

    def stop(self) -> None:
        """Everything down: each Patroni stops its PostgreSQL; what is left is killed."""
        for node in self.nodes:
            _signal(node.processes(), signal.SIGCONT)  # a frozen node cannot stop
            if node.proc and node.proc.poll() is None:
                node.proc.terminate()
        for node in self.nodes:
            if node.proc:
                try:
                    node.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    node.proc.kill()
                    node.proc.wait()
            _signal(node.processes(), signal.SIGKILL)
        if self.etcd and self.etcd.poll() is None:
            self.etcd.terminate()
            try:
                self.etcd.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
                self.etcd.wait()

    # -- faults ---------------------------------------------------------------------------------

    def kill(self, node: Node) -> None:
        """The host dies: SIGKILL to its Patroni first (so it restarts
        nothing), then to every PostgreSQL process."""
        patroni = node.patroni()
        if patroni:
            _signal(process_tree(patroni), signal.SIGKILL)
            if node.proc is not None:
                node.proc.wait()
        _signal(node.processes(), signal.SIGKILL)

    def freeze(self, node: Node) -> None:
        """The host hangs: SIGSTOP to every process of the node; the
        connections its clients hold stay open, unanswered. Stopped again
        until no new process appears (the postmaster may fork one between
        the list and the signal)."""
        stopped: set[int] = set()
        for _ in range(20):
            fresh = [pid for pid in node.processes() if pid not in stopped]
            if not fresh:
                return
            _signal(fresh, signal.SIGSTOP)
            stopped.update(fresh)

    def thaw(self, node: Node) -> None:
        _signal(node.processes(), signal.SIGCONT)

    # -- state ----------------------------------------------------------------------------------

    def members(self) -> list[dict[str, Any]]:
        """Patroni's view of the cluster (name, role, state, timeline, lag), from the first node that answers."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is not None:
                continue  # killed
            try:
                return list(_http_json(f"http://127.0.0.1:{node.rest_port}/cluster").get("members", []))
            except (OSError, ValueError):
                continue
        return []

    def _with_role(self, *roles: str) -> str | None:
        for member in self.members():
            if member.get("role") in roles and member.get("state") in ("running", "streaming"):
                return str(member["name"])
        return None

    def leader(self) -> str | None:
        return self._with_role("leader", "master")

    def sync_standby(self) -> str | None:
        return self._with_role("sync_standby")

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> float:
        """Poll ``condition`` until true; the seconds it took. Raises with the cluster's state on timeout."""
        started = time.monotonic()
        while not condition():
            for node in self.nodes:
                if node.proc is not None and node.proc.returncode is None and node.proc.poll() is not None:
                    out = (node.home / "patroni.out").read_text(errors="replace")[-2000:]
                    raise ClusterError(
                        f"{node.name}'s Patroni exited ({node.proc.returncode}) while waiting for {what}:\n{out}"
                    )
            if time.monotonic() - started > timeout:
                raise ClusterError(f"waited {timeout:.0f} s for {what}; cluster: {self.members()}; logs in {self.root}")
            time.sleep(0.2)
        return time.monotonic() - started

    @classmethod
    def attach(cls, root: Path) -> Cluster:
        """The cluster :meth:`start` left running under ``root`` (for ``status`` and ``stop``)."""
        saved = json.loads((Path(root) / "cluster.json").read_text())
        cluster = cls(root, saved["base_port"], nodes=saved["nodes"])
        return cluster


def _stop_saved(root: Path) -> None:
    """Stop what a ``start`` in another process left, by the pids it wrote
    (each checked to still run this cluster's configuration): resume a
    frozen node, ask each Patroni to stop its PostgreSQL, kill what is left."""
    cluster = Cluster.attach(root)
    for node in cluster.nodes:
        _signal(node.processes(), signal.SIGCONT)
    patronis = [pid for node in cluster.nodes if (pid := node.patroni())]
    _signal(patronis, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in patronis) and time.monotonic() < deadline:
        time.sleep(0.2)
    for node in cluster.nodes:
        _signal(node.processes(), signal.SIGKILL)
    with contextlib.suppress(OSError, ValueError):
        etcd = int((cluster.root / "etcd" / "etcd.pid").read_text())
        if _runs(etcd, str(cluster.root / "etcd" / "data")):
            _signal([etcd], signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "status", "stop"])
    parser.add_argument("dir", type=Path, help="a folder of its own for the cluster's data, configuration and logs")
    parser.add_argument(
        "--base-port", type=int, default=None, help="first of 30 ports (default: a free span from 25400)"
    )
    parser.add_argument("--nodes", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        if args.action == "start":
            cluster = Cluster(args.dir, args.base_port or free_base_port(), nodes=args.nodes)
            try:
                cluster.start()
            except BaseException:
                cluster.stop()
                raise
            print(cluster.url())
        elif args.action == "status":
            for member in Cluster.attach(args.dir).members():
                print(json.dumps(member))
        else:
            _stop_saved(args.dir)
    except ClusterError as exc:
        print(f"cluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
