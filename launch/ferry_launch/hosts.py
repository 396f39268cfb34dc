"""Hosts: which are this machine, the address a server binds, Slurm host lists."""

import ipaddress
import itertools
import re

from .common import LaunchError


_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def is_local(host):
    """True for this machine's loopback names: localhost, 127.0.0.0/8, ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def canonical_host(host):
    return "127.0.0.1" if host == "localhost" else host


def bind_address(host):
    """The address ferry-ps binds for a server at HOST. ZeroMQ binds interfaces, never DNS names:
    an IPv4 literal is bound as is, localhost as 127.0.0.1, a name as 0.0.0.0 (all interfaces)."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        ipaddress.IPv4Address(host)
        return host
    except ValueError:
        return "0.0.0.0"


def expand_hostlist(text, what="SLURM_JOB_NODELIST"):
    """Expands Slurm's compressed host list, keeping its order and dropping repeats:
    "node[01-03,07],gpu-a1" -> node01 node02 node03 node07 gpu-a1. A range keeps the width of its
    first number ("n[8-10]" -> n8 n9 n10, "n[08-10]" -> n08 n09 n10); several bracket groups in
    one name multiply ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2)."""
    def bad(why):
        return LaunchError(f"{what} '{text}': {why}")

    entries, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            if depth:
                raise bad("nested '['")
            depth = 1
        elif ch == "]":
            if not depth:
                raise bad("']' without '['")
            depth = 0
        elif ch == "," and not depth:
            entries.append(text[start:i])
            start = i + 1
    if depth:
        raise bad("'[' without ']'")
    entries.append(text[start:])

    hosts = []
    for entry in entries:
        entry = entry.strip()
        if not entry:
            raise bad("empty host name")
        parts = re.split(r"\[([^\]]*)\]", entry)  # literal, group, literal, group, ..., literal
        choices = []
        for k, part in enumerate(parts):
            if k % 2 == 0:
                choices.append([part])
                continue
            names = []
            for item in part.split(","):
                m = re.fullmatch(r"(\d+)(?:-(\d+))?", item.strip())
                if not m:
                    raise bad(f"bad range '{item}' in '{entry}' (want N or N-M)")
                lo, hi = m.group(1), m.group(2) or m.group(1)
                if int(hi) < int(lo):
                    raise bad(f"range '{item}' in '{entry}' runs backwards")
                names += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1)]
            choices.append(names)
        for combo in itertools.product(*choices):
            name = "".join(combo)
            if not _HOST_RE.match(name):
                raise bad(f"bad host name '{name}'")
            hosts.append(name)
    return list(dict.fromkeys(hosts))
