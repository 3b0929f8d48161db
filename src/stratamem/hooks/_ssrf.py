"""Where a webhook may connect: resolve the host once, refuse non-public addresses.

A service that POSTs to URLs its users type must not become a way into its own network:
a target whose host resolves to a loopback, private, link-local, multicast, reserved or
unspecified address (IPv4 or IPv6, including IPv4 carried inside IPv6) is refused unless
the allow-list (``STRATAMEM_WEBHOOK_ALLOW``: host names, ``*.domain`` wildcards, IPs and
CIDRs) permits it. The caller then connects to the address that was checked, so a DNS
answer that changes between the check and the connection (rebinding) cannot redirect it.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .._strings import text_problem

__all__ = [
    "AllowList",
    "DeliveryError",
    "Pinned",
    "Resolver",
    "Target",
    "TargetRefused",
    "forbidden_reason",
    "parse_target",
    "pin",
    "system_resolver",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# (host, port) -> the addresses it resolves to, as strings.
Resolver = Callable[[str, int], Sequence[str]]

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_MAX_URL = 2000


class DeliveryError(Exception):
    """A delivery could not be made; the message is the reason the log records."""


class TargetRefused(DeliveryError):
    """The target is not allowed (its address, or the URL itself)."""


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _embedded_ipv4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for: ::ffff:a.b.c.d, 6to4, NAT64."""
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr in _NAT64:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def forbidden_reason(addr: IPAddress) -> str | None:
    """Why ``addr`` is not a public unicast address, or ``None`` when it is one."""
    if isinstance(addr, ipaddress.IPv6Address):
        inner = _embedded_ipv4(addr)
        if inner is not None:
            reason = forbidden_reason(inner)
            return None if reason is None else f"{reason} (as {inner} inside IPv6)"
    for flag, label in (
        ("is_unspecified", "an unspecified address"),
        ("is_loopback", "a loopback address"),
        ("is_link_local", "a link-local address"),
        ("is_multicast", "a multicast address"),
        ("is_reserved", "a reserved address"),
        ("is_private", "a private address"),
    ):
        if getattr(addr, flag):
            return label
    if not addr.is_global:
        return "not a public address"
    return None


@dataclass(frozen=True)
class AllowList:
    """Hosts and networks a webhook may reach although they are not public."""

    hosts: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, spec: str) -> AllowList:
        hosts: set[str] = set()
        suffixes: list[str] = []
        networks: list[IPNetwork] = []
        for entry in spec.replace(",", " ").split():
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            name = entry.lower().rstrip(".")
            if name.startswith("*."):
                suffixes.append(name[1:])
            else:
                hosts.add(name)
        return cls(frozenset(hosts), tuple(suffixes), tuple(networks))

    def permits_host(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return host in self.hosts or any(host.endswith(s) for s in self.suffixes)

    def permits_address(self, addr: IPAddress) -> bool:
        candidates: list[IPAddress] = [addr]
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            candidates.append(addr.ipv4_mapped)
        return any(a in net for a in candidates for net in self.networks)


@dataclass(frozen=True)
class Target:
    """A webhook URL, parsed: ``host`` is ASCII (IDNA) without brackets."""

    scheme: str
    host: str
    port: int
    path: str

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def parse_target(url: str) -> Target:
    """Parse an http(s) target URL; raises ``TargetRefused`` saying what is wrong."""
    if not isinstance(url, str) or not url.strip():
        raise TargetRefused("target_url: expected an http(s) URL")
    if len(url) > _MAX_URL:
        raise TargetRefused(f"target_url: longer than {_MAX_URL} characters")
    if (problem := text_problem(url)) is not None:
        raise TargetRefused(f"target_url: {problem}")
    import httpx  # lazily: `import stratamem` must not pay for it

    try:
        parsed = httpx.URL(url.strip())
        host = parsed.raw_host.decode("ascii")
    except (httpx.InvalidURL, UnicodeError, ValueError) as exc:
        raise TargetRefused(f"target_url: not a valid URL ({exc})") from None
    if parsed.scheme not in ("http", "https"):
        raise TargetRefused("target_url: the scheme must be http or https")
    if not host:
        raise TargetRefused("target_url: no host")
    if parsed.userinfo:
        # Credentials in the URL would be stored, listed and logged with it; deliveries
        # are authenticated by their signature instead.
        raise TargetRefused("target_url: must not carry credentials (user:password@)")
    if parsed.fragment:
        raise TargetRefused("target_url: must not have a #fragment")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return Target(parsed.scheme, host.lower(), port, parsed.raw_path.decode("ascii") or "/")


def literal_address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


@dataclass(frozen=True)
class Pinned:
    """A target and the checked address the connection must go to."""

    target: Target
    address: str

    @property
    def url(self) -> str:
        ip = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.target.scheme}://{ip}:{self.target.port}{self.target.path}"


def _resolve(resolver: Resolver, host: str, port: int, timeout: float) -> list[str]:
    # getaddrinfo has no timeout of its own: resolve in a daemon thread and stop waiting
    # at the delivery's deadline (a stuck resolver then costs a parked thread, not a hang).
    addresses: list[list[str]] = []
    errors: list[Exception] = []

    def run() -> None:
        try:
            addresses.append(list(resolver(host, port)))
        except Exception as exc:
            errors.append(exc)

    worker = threading.Thread(target=run, name="stratamem-resolve", daemon=True)
    worker.start()
    worker.join(max(0.0, timeout))
    if addresses:
        return addresses[0]
    if errors:
        raise DeliveryError(f"unreachable: cannot resolve {host}: {errors[0]}")
    raise DeliveryError(f"timed out after {timeout * 1000:.0f} ms resolving {host}")


def pin(
    target: Target, allow: AllowList, resolver: Resolver = system_resolver, timeout: float = 5.0
) -> Pinned:
    """Resolve ``target`` and check every address; the first is the one to connect to.

    Every address must pass, not just one: a host that resolves to a public and a private
    address is refused, so which one a client would pick never matters.
    """
    literal = literal_address(target.host)
    addresses = (
        [target.host]
        if literal is not None
        else _resolve(resolver, target.host, target.port, timeout)
    )
    if not addresses:
        raise DeliveryError(f"unreachable: {target.host} has no address")
    host_allowed = allow.permits_host(target.host)
    for text in addresses:
        try:
            addr = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            raise DeliveryError(f"unreachable: resolver returned {text!r}") from None
        reason = forbidden_reason(addr)
        if reason is None or host_allowed or allow.permits_address(addr):
            continue
        shown = target.host if literal is not None else f"{target.host} resolves to {addr}"
        raise TargetRefused(
            f"refused: {shown}, {reason}; add the host or a CIDR to STRATAMEM_WEBHOOK_ALLOW "
            "to permit it"
        )
    return Pinned(target, addresses[0])
