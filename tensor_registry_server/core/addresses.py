"""Which addresses the registry may connect to: the address half of the outbound rules.

Loopback, private, link-local, CGNAT, multicast, reserved and documentation ranges are refused,
and so is every IPv6 form that embeds a refused IPv4 address (mapped, compatible, translated,
6to4, NAT64); numeric hosts are read the way browsers and the C resolver read them. An
operator's ``AllowList`` opts hosts and networks back in. The fetcher
(tensor_registry_server/core/fetch.py) applies these rules to every resolved address of every
hop; the webhook and source-URI checks apply them to literal hosts when a URL is registered.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NUMBER_LABEL = re.compile(r"^(?:[0-9]+|0[xX][0-9a-fA-F]*)$")

_REFUSED_V4 = tuple(
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8",  # "this network", 0.0.0.0 included
        "10.0.0.0/8",
        "100.64.0.0/10",  # CGNAT
        "127.0.0.0/8",
        "169.254.0.0/16",  # link-local, cloud metadata services
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.88.99.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, 255.255.255.255 included
    )
)
_REFUSED_V6 = tuple(
    ipaddress.IPv6Network(n)
    for n in (
        "::/128",
        "::1/128",
        "64:ff9b:1::/48",  # local-use NAT64
        "100::/64",  # discard
        "2001::/32",  # Teredo (the client address is obfuscated: refuse the whole range)
        "2001:db8::/32",
        "fc00::/7",  # unique local
        "fe80::/10",
        "fec0::/10",  # deprecated site-local
        "ff00::/8",  # multicast
    )
)
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
_COMPATIBLE = ipaddress.IPv6Network("::/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")


# -- address rules -----------------------------------------------------------------------------
def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, translated, compatible, NAT64, 6to4)."""
    value = int(ip)
    for network in (_MAPPED, _TRANSLATED, _NAT64):
        if ip in network:
            return ipaddress.IPv4Address(value & 0xFFFFFFFF)
    if ip in _COMPATIBLE and value > 1:
        return ipaddress.IPv4Address(value & 0xFFFFFFFF)
    if ip in _SIX_TO_FOUR:
        return ipaddress.IPv4Address((value >> 80) & 0xFFFFFFFF)
    return None


def is_refused_address(ip: IPAddress) -> bool:
    """True for every address the registry must not connect to unless allow-listed."""
    if isinstance(ip, ipaddress.IPv6Address):
        ip = ip.ipv4_mapped or ip
    if isinstance(ip, ipaddress.IPv4Address):
        return any(ip in n for n in _REFUSED_V4) or not ip.is_global
    if any(ip in n for n in _REFUSED_V6):
        return True
    inner = embedded_ipv4(ip)
    if inner is not None:
        return is_refused_address(inner)
    return not ip.is_global


def _ipv4_number(label: str) -> int:
    if label[:2].lower() == "0x":
        return int(label[2:] or "0", 16)
    if len(label) > 1 and label[0] == "0":
        if any(c not in "01234567" for c in label):
            raise ValueError(label)
        return int(label, 8)
    return int(label, 10)


def parse_host(host: str) -> IPAddress | None:
    """The address a host names literally (every numeric form), or None for a DNS name.

    Raises ValueError for a host that ends in a number but is no valid IPv4 address."""
    host = unquote(host).strip("[]")
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    labels = host.split(".")
    if len(labels) > 1 and labels[-1] == "":
        labels.pop()
    if not labels or not _NUMBER_LABEL.match(labels[-1]):
        return None
    # WHATWG URL "ends in a number": the whole host is an IPv4 address in inet_aton's forms.
    if len(labels) > 4 or not all(_NUMBER_LABEL.match(part) for part in labels):
        raise ValueError(f"malformed numeric host {host!r}")
    numbers = [_ipv4_number(part) for part in labels]
    if any(n > 255 for n in numbers[:-1]) or numbers[-1] >= 256 ** (5 - len(numbers)):
        raise ValueError(f"malformed numeric host {host!r}")
    value = numbers[-1]
    for index, number in enumerate(numbers[:-1]):
        value += number << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


def is_local_name(host: str) -> bool:
    host = host.rstrip(".").lower()
    return host == "localhost" or host.endswith(".localhost")


@dataclass(frozen=True)
class AllowList:
    """Operator opt-ins: host names (exact, case-insensitive) and IP networks."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    @classmethod
    def parse(cls, entries: Sequence[str]) -> AllowList:
        hosts, networks = set(), []
        for entry in entries:
            entry = entry.strip()
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                hosts.add(entry.rstrip(".").lower())
        return cls(frozenset(hosts), tuple(networks))

    def allows_host(self, host: str) -> bool:
        return host.rstrip(".").lower() in self.hosts

    def allows_address(self, ip: IPAddress) -> bool:
        candidates: list[IPAddress] = [ip]
        if isinstance(ip, ipaddress.IPv6Address) and (inner := embedded_ipv4(ip)) is not None:
            candidates.append(inner)
        return any(c in n for c in candidates for n in self.networks if c.version == n.version)
