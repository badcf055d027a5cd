"""A NAT testbed made of Linux network namespaces: public hosts on one bridge, and private hosts
each behind its own router that masquerades (real NAT, no port forwarding).

::

    public  ntpub<i>   10.78.0.(10+i)/24 on the bridge (hub namespace nthub)
    router  ntrt<j>    wan 10.78.0.(100+j)/24 on the bridge, lan 192.168.(j+1).1/24, nft masquerade
    private ntprv<j>   192.168.(j+1).2/24, default route via its router

A private host reaches every public address (its packets leave with its router's address) and
nothing reaches it: a packet to its router's address finds no forwarding rule, and its own
address (192.168.x.2) is not routed anywhere outside its LAN, as on the internet. Hosts' uploads
are capped with htb on their egress (as ../shared/tools/netbed.sh does), the private hosts' at
their router's wan side too. The names (nt...) differ from netbed.sh's (cb..., cbhub), so both
testbeds can exist at once.

:func:`why_not_available` says why a machine cannot build one (not root, no ip, tc or nft).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

__all__ = ["NatTestbed", "why_not_available"]

HUB = "nthub"
BRIDGE = "ntbr0"
PUBLIC_NET = "10.78.0"


def why_not_available() -> str | None:
    """None if namespaces with NAT can be made here, else why not (for ``pytest.skip``)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "nft"):
        if shutil.which(tool) is None:
            return f"the NAT testbed needs {tool} (iproute2, nftables)"
    return None


def _sh(*cmd: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()}")


def _names() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    names = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    return [n for n in names if n == HUB or n.startswith(("ntpub", "ntrt", "ntprv"))]


class NatTestbed:
    """``public`` public hosts and ``private`` hosts behind their own NAT; upload caps in Mbit/s
    (0: none). Use as a context manager, or call :meth:`up` and :meth:`down`."""

    def __init__(self, public: int, private: int, rate_mbit: int = 0) -> None:
        if not 1 <= public <= 80 or not 0 <= private <= 80:
            raise ValueError("public must be 1..80 and private 0..80")
        self.public = public
        self.private = private
        self.rate_mbit = rate_mbit

    # -- addresses and namespaces ------------------------------------------------------------

    @staticmethod
    def public_ip(i: int) -> str:
        return f"{PUBLIC_NET}.{10 + i}"

    @staticmethod
    def router_ip(j: int) -> str:
        """The address private host ``j``'s packets carry once NATed."""
        return f"{PUBLIC_NET}.{100 + j}"

    @staticmethod
    def private_ip(j: int) -> str:
        return f"192.168.{j + 1}.2"

    @staticmethod
    def public_ns(i: int) -> str:
        return f"ntpub{i}"

    @staticmethod
    def private_ns(j: int) -> str:
        return f"ntprv{j}"

    def wrap(self, ns: str) -> list[str]:
        """The command prefix that runs a program inside namespace ``ns``."""
        return ["ip", "netns", "exec", ns]

    # -- building ----------------------------------------------------------------------------

    def __enter__(self) -> NatTestbed:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        self.down()  # a testbed left over by a killed run
        try:
            self._build()
        except BaseException:
            self.down()
            raise

    def _build(self) -> None:
        _sh("ip", "netns", "add", HUB)
        _sh("ip", "-n", HUB, "link", "set", "lo", "up")
        _sh("ip", "-n", HUB, "link", "add", BRIDGE, "type", "bridge")
        _sh("ip", "-n", HUB, "link", "set", BRIDGE, "up")
        for i in range(self.public):
            ns = self.public_ns(i)
            self._host(ns)
            self._wire(ns, "eth0", f"hp{i}", f"{self.public_ip(i)}/24")
            self._cap(ns, "eth0")
        for j in range(self.private):
            router, host = f"ntrt{j}", self.private_ns(j)
            self._host(router)
            self._host(host)
            _sh("ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            self._wire(router, "wan", f"hr{j}", f"{self.router_ip(j)}/24")
            self._cap(router, "wan")
            _sh("ip", "-n", router, "link", "add", "lan", "type", "veth", "peer", "eth0",
                "netns", host)  # fmt: skip
            _sh("ip", "-n", router, "addr", "add", f"192.168.{j + 1}.1/24", "dev", "lan")
            _sh("ip", "-n", router, "link", "set", "lan", "up")
            _sh("ip", "-n", host, "addr", "add", f"{self.private_ip(j)}/24", "dev", "eth0")
            _sh("ip", "-n", host, "link", "set", "eth0", "up")
            _sh("ip", "-n", host, "route", "add", "default", "via", f"192.168.{j + 1}.1")
            self._cap(host, "eth0")
            # Masquerade what leaves by the wan side; accept back only replies (conntrack), so
            # an outside dial to the router's address is never forwarded: no port forwarding.
            rules = (
                "table ip nat {\n"
                " chain natout { type nat hook postrouting priority 100; "
                'oifname "wan" masquerade; }\n'
                "}\n"
                "table ip filter {\n"
                " chain passing { type filter hook forward priority 0; policy drop;\n"
                '  iifname "lan" oifname "wan" accept;\n'
                "  ct state established,related accept; }\n"
                "}\n"
            )
            done = subprocess.run(
                ["ip", "netns", "exec", router, "nft", "-f", "-"],
                input=rules,
                capture_output=True,
                text=True,
                timeout=30,
            )
            if done.returncode != 0:
                raise RuntimeError(f"nft in {router} failed: {done.stderr.strip()}")

    def _host(self, ns: str) -> None:
        _sh("ip", "netns", "add", ns)
        _sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1")  # fmt: skip
        _sh("ip", "-n", ns, "link", "set", "lo", "up")

    def _wire(self, ns: str, dev: str, hub_end: str, cidr: str) -> None:
        """A veth from ``ns`` (named ``dev``) to the bridge in the hub."""
        _sh("ip", "-n", HUB, "link", "add", hub_end, "type", "veth", "peer", dev, "netns", ns)
        _sh("ip", "-n", HUB, "link", "set", hub_end, "master", BRIDGE, "up")
        _sh("ip", "-n", ns, "addr", "add", cidr, "dev", dev)
        _sh("ip", "-n", ns, "link", "set", dev, "up")

    def _cap(self, ns: str, dev: str) -> None:
        if self.rate_mbit <= 0:
            return
        rate = f"{self.rate_mbit}mbit"
        _sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb",
            "default", "1")  # fmt: skip
        _sh("tc", "-n", ns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
            "rate", rate, "ceil", rate, "quantum", "65536",
            "burst", "256k", "cburst", "256k")  # fmt: skip

    def down(self) -> None:
        """Delete every namespace of the testbed (their veths and the bridge go with them)."""
        for ns in _names():
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=30)

    def reaches(self, src_ns: str, ip: str, port: int, timeout_s: float = 2.0) -> bool:
        """Whether a TCP connection from ``src_ns`` to ``ip:port`` is accepted."""
        code = (
            "import socket,sys\n"
            f"s=socket.socket(); s.settimeout({timeout_s})\n"
            f"sys.exit(0 if s.connect_ex(({ip!r}, {port})) == 0 else 1)\n"
        )
        done = subprocess.run(
            [*self.wrap(src_ns), "python3", "-c", code], capture_output=True, timeout=30
        )
        return done.returncode == 0

    def namespaces(self) -> Sequence[str]:
        return _names()
