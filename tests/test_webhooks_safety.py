"""Webhook safety below the pipeline: address checks, DNS pinning, TLS, signatures.

Host names are resolved through the resolver parameter of our own HTTP sender (no mocks of
the code under test): a resolver is just a function from (host, port) to addresses.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import standardwebhooks
import trustme

from fakes.webhook_receiver import WebhookReceiver, silent_port
from stratamem.hooks._http import WebhookHttp, http_failure
from stratamem.hooks._signing import new_secret, sign, signature_headers
from stratamem.hooks._ssrf import (
    AllowList,
    DeliveryError,
    TargetRefused,
    forbidden_reason,
    parse_target,
    pin,
)


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "not a public address"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fe80::1", "link-local"),
        ("fc00::1", "private"),
        ("ff02::1", "multicast"),
        ("::ffff:127.0.0.1", "loopback address (as 127.0.0.1 inside IPv6)"),
        ("::ffff:169.254.169.254", "link-local"),
        ("2002:a00:1::", "private address (as 10.0.0.1 inside IPv6)"),
        ("64:ff9b::a9fe:a9fe", "link-local address (as 169.254.169.254 inside IPv6)"),
    ],
)
def test_non_public_addresses_are_named(address: str, why: str) -> None:
    reason = forbidden_reason(ipaddress.ip_address(address))
    assert reason is not None and why in reason


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert forbidden_reason(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/x",
        "http://10.0.0.1/x",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/x",
        "http://[::ffff:10.0.0.1]/x",
    ],
)
def test_literal_private_targets_are_refused(url: str) -> None:
    with pytest.raises(TargetRefused, match=r"refused: .*STRATAMEM_WEBHOOK_ALLOW"):
        pin(parse_target(url), AllowList(), resolver=_no_dns)


def _no_dns(host: str, port: int) -> list[str]:
    raise AssertionError(f"a literal address needs no resolution ({host})")


def test_a_host_name_resolving_to_a_private_address_is_refused() -> None:
    target = parse_target("https://hooks.example.com/in")
    with pytest.raises(TargetRefused, match=r"hooks.example.com resolves to 10.1.2.3, a private"):
        pin(target, AllowList(), resolver=lambda h, p: ["10.1.2.3"])
    # One bad address among good ones is enough: which one a client picks must not matter.
    with pytest.raises(TargetRefused, match=r"169\.254\.169\.254"):
        pin(target, AllowList(), resolver=lambda h, p: ["93.184.216.34", "169.254.169.254"])
    with pytest.raises(TargetRefused, match="::1, a loopback"):
        pin(target, AllowList(), resolver=lambda h, p: ["::1"])
    pinned = pin(target, AllowList(), resolver=lambda h, p: ["93.184.216.34"])
    assert pinned.url == "https://93.184.216.34:443/in"


def test_the_allow_list_permits_hosts_wildcards_and_networks() -> None:
    private = lambda h, p: ["10.1.2.3"]  # noqa: E731
    target = parse_target("http://hooks.internal:8080/x")
    for spec in ("hooks.internal", "*.internal", "10.1.0.0/16", "10.1.2.3", "a.b, 10.0.0.0/8"):
        pinned = pin(target, AllowList.parse(spec), resolver=private)
        assert pinned.address == "10.1.2.3" and pinned.url == "http://10.1.2.3:8080/x"
    for spec in ("other.internal", "*.example.com", "10.2.0.0/16", "internal"):
        with pytest.raises(TargetRefused):
            pin(target, AllowList.parse(spec), resolver=private)
    # An IPv4 network also covers the IPv4-mapped IPv6 form of its addresses.
    assert pin(parse_target("http://[::ffff:10.1.2.3]/"), AllowList.parse("10.0.0.0/8"))


def test_resolution_failures_and_hangs_are_bounded() -> None:
    target = parse_target("http://slow.example/")

    def broken(host: str, port: int) -> list[str]:
        raise socket.gaierror("Name or service not known")

    def slow(host: str, port: int) -> list[str]:
        time.sleep(5)
        return ["93.184.216.34"]

    with pytest.raises(DeliveryError, match=r"cannot resolve slow\.example"):
        pin(target, AllowList(), resolver=broken)
    started = time.monotonic()
    with pytest.raises(DeliveryError, match=r"timed out after 200 ms resolving slow\.example"):
        pin(target, AllowList(), resolver=slow, timeout=0.2)
    assert time.monotonic() - started < 3
    with pytest.raises(DeliveryError, match="no address"):
        pin(target, AllowList(), resolver=lambda h, p: [])


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as r:
        yield r


def test_the_connection_goes_to_the_checked_address(receiver: WebhookReceiver) -> None:
    # The first answer is the receiver on 127.0.0.1 (allowed by address); every later one is
    # a private address (DNS rebinding). Each delivery resolves once and connects to what it
    # checked: "rebind.test" itself does not exist for the system resolver.
    answers = iter([["127.0.0.1"], ["10.9.9.9"]])
    calls: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        calls.append(host)
        return next(answers)

    http = WebhookHttp(AllowList.parse("127.0.0.1"), resolver=rebinding)
    url = f"http://rebind.test:{receiver.port}/pinned?x=1"
    first = http.post(url, b"{}", {}, 2000)
    assert http_failure(first) is None and calls == ["rebind.test"]
    (request,) = receiver.requests
    assert request.path == "/pinned?x=1"
    assert request.headers["host"] == f"rebind.test:{receiver.port}"
    second = http.post(url, b"{}", {}, 2000)
    assert second.error is not None and "10.9.9.9, a private address" in second.error
    assert calls == ["rebind.test", "rebind.test"] and len(receiver.requests) == 1
    http.close()


def test_proxies_from_the_environment_are_not_used(
    receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{dead}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    http = WebhookHttp(AllowList.parse("127.0.0.1"))
    result = http.post(receiver.url("/direct"), b"{}", {}, 2000)
    assert http_failure(result) is None and len(receiver.at("/direct")) == 1
    http.close()


class _TLSReceiver:
    """An https receiver on 127.0.0.1 presenting a certificate for ``name``."""

    def __init__(self, ca: trustme.CA, name: str) -> None:
        self.sni: list[str | None] = []
        self.hosts: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                outer.hosts.append(self.headers["host"])
                body = b'{"data": {}}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert(name).configure_cert(context)
        context.sni_callback = lambda sock, server_name, ctx: outer.sni.append(server_name)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_tls_uses_the_host_name_for_sni_and_verification() -> None:
    ca = trustme.CA()
    trust = ssl.create_default_context()
    ca.configure_trust(trust)
    to_loopback = lambda h, p: ["127.0.0.1"]  # noqa: E731
    good = _TLSReceiver(ca, "hooks.test")
    wrong = _TLSReceiver(ca, "elsewhere.test")
    try:
        http = WebhookHttp(AllowList.parse("hooks.test"), resolver=to_loopback, tls=trust)
        result = http.post(f"https://hooks.test:{good.port}/tls", b"{}", {}, 3000)
        assert http_failure(result) is None, result.error
        assert good.sni == ["hooks.test"] and good.hosts == [f"hooks.test:{good.port}"]
        # A certificate for another name is refused although the address was allowed.
        refused = http.post(f"https://hooks.test:{wrong.port}/tls", b"{}", {}, 3000)
        assert refused.error is not None and "CERTIFICATE_VERIFY_FAILED" in refused.error
        assert wrong.sni == ["hooks.test"]
        # Without the private CA in its trust store, the public-CA default refuses too.
        public = WebhookHttp(AllowList.parse("hooks.test"), resolver=to_loopback)
        untrusted = public.post(f"https://hooks.test:{good.port}/tls", b"{}", {}, 3000)
        assert untrusted.error is not None and "CERTIFICATE_VERIFY_FAILED" in untrusted.error
        http.close()
        public.close()
    finally:
        good.close()
        wrong.close()


def test_signatures_verify_with_the_standard_webhooks_library() -> None:
    secret = new_secret()
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32
    body = json.dumps({"data": {"observations": ["é"]}}, ensure_ascii=False).encode()
    headers = signature_headers([secret], "msg_1", body)
    assert standardwebhooks.Webhook(secret).verify(body, headers) == {
        "data": {"observations": ["é"]}
    }
    when = datetime(2026, 5, 1, tzinfo=timezone.utc)
    expected = standardwebhooks.Webhook(secret).sign("msg_1", when, body.decode())
    assert sign(secret, "msg_1", int(when.timestamp()), body) == expected
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(secret).verify(body + b" ", headers)  # tampered body
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(new_secret()).verify(body, headers)  # another secret
    stale = signature_headers([secret], "msg_1", body, timestamp=int(time.time()) - 3600)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError, match="too old"):
        standardwebhooks.Webhook(secret).verify(body, stale)


def test_two_signatures_verify_with_either_secret() -> None:
    # During a rotation's grace period a delivery carries a signature per secret.
    new, old = new_secret(), new_secret()
    body = b'{"data": {}}'
    headers = signature_headers([new, old], "msg_1", body)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (new, old):
        assert standardwebhooks.Webhook(secret).verify(body, headers) == {"data": {}}
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(new_secret()).verify(body, headers)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://h/x", "scheme"),
        ("http:///x", "no host"),
        ("http://u:p@h.example/x", "credentials"),
        ("https://h.example/x#frag", "fragment"),
        ("https://h.example/" + "x" * 2001, "longer than 2000"),
    ],
)
def test_target_urls_are_checked(url: str, problem: str) -> None:
    with pytest.raises(TargetRefused, match=problem):
        parse_target(url)


def test_target_parsing_keeps_host_port_and_path() -> None:
    t = parse_target("https://Hooks.Example.com:8443/in/box?token=a%20b")
    assert (t.scheme, t.host, t.port, t.path) == (
        "https",
        "hooks.example.com",
        8443,
        "/in/box?token=a%20b",
    )
    assert t.host_header == "hooks.example.com:8443"
    assert parse_target("http://[2606:4700::1]/").host_header == "[2606:4700::1]"
    assert parse_target("https://bücher.example/").host == "xn--bcher-kva.example"


@pytest.mark.parametrize("host", ["2130706433", "127.1", "0x7f.0.0.1"])
def test_other_spellings_of_loopback_are_refused_after_resolution(host: str) -> None:
    # Not literal addresses to a URL parser, but the system resolver reads them as 127.0.0.1:
    # the check runs on what the name resolves to, so the spelling does not matter.
    with pytest.raises(TargetRefused, match="loopback"):
        pin(parse_target(f"http://{host}:8080/x"), AllowList())


# The receiver below trickles for 10 s (a byte every 50 ms); a delivery must end at its
# timeout, whatever step the receiver drags out. The margin is for a loaded machine: a
# per-read timeout (what httpx offers) ends these after seconds, not 300 ms + margin.
TIMEOUT_MS = 300
MARGIN_MS = 1500


@pytest.mark.parametrize(
    ("case", "step"),
    [
        ("trickled body", "reading the answer body ("),
        ("trickled head", "waiting for the status line and headers"),
        ("no answer", "waiting for the status line and headers"),
        ("no TLS handshake", "in the TLS handshake"),
        ("no connection", "connecting"),
    ],
)
def test_a_delivery_ends_at_its_timeout_whatever_the_receiver_does(
    receiver: WebhookReceiver, case: str, step: str
) -> None:
    http = WebhookHttp(AllowList.parse("127.0.0.1"))
    with silent_port() as silent, silent_port(accepting=False) as full:
        url = {
            "trickled body": receiver.url("/trickle-body"),
            "trickled head": receiver.url("/trickle-head"),
            "no answer": f"http://127.0.0.1:{silent}/hook",
            "no TLS handshake": f"https://127.0.0.1:{silent}/hook",
            "no connection": f"http://127.0.0.1:{full}/hook",
        }[case]
        started = time.monotonic()
        result = http.post(url, b"{}", {}, TIMEOUT_MS)
        took = (time.monotonic() - started) * 1000
    http.close()
    assert TIMEOUT_MS <= took < TIMEOUT_MS + MARGIN_MS, (case, took, result.error)
    assert result.error is not None
    # The reason says what was cut short and after how long, truthfully.
    match = re.fullmatch(r"timed out after (\d+) ms (.+) \(timeout 300 ms\)", result.error)
    assert match is not None, result.error
    assert match[2].startswith(step), result.error
    assert TIMEOUT_MS <= int(match[1]) <= took + 1 and abs(result.latency_ms - took) < 50
    if case == "trickled body":
        assert result.status == 200 and 0 < len(result.body) < receiver.trickle_bytes
