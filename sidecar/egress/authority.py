"""The sleeve's own certificate authority, for the egress proxy's TLS termination of the hosts
that have a secret: made once and kept in the state dir, constrained to those hosts, issuing a
certificate per host on first use; and the files and variables that make the CLI trust it.

Certificates are made by the `openssl` command line (on every machine we run: Debian's
ca-certificates depends on it), not by `cryptography`: nothing is imported into the sidecar for
it (`ssl` is there already), and it runs once per host. The keys never pass through an argv.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import re
import ssl
import time
from collections.abc import Iterable
from pathlib import Path

from sidecar.core.files import fill, read_limited, replacing
from sidecar.egress.allowlist import is_ip

log = logging.getLogger(__name__)

CA_DAYS = 3650
LEAF_DAYS = 397  # what the browsers' rules allow a server certificate; the CLIs never mind
LEAF_RENEW = 300 * 86400.0  # a cached certificate older than this is made again
MAX_BUNDLE = 4 * 1024 * 1024  # a system bundle is ~200 KiB
# Hosts' certificates kept (in memory and on disk): a secret for `*.example.com` would otherwise
# let the agent have one made for every name it can think of; the oldest goes first.
MAX_LEAVES = 128
_HOST = re.compile(r"[a-z0-9*][a-z0-9.:*-]*")  # a normalised host: never a path
# Every variable a TLS library among the CLIs' reads for its trusted roots: OpenSSL (curl,
# Python, Rust's native-tls and rustls-native-certs), Node's extra roots, requests, git.
BUNDLE_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO")
EXTRA_VAR = "NODE_EXTRA_CA_CERTS"


class AuthorityError(Exception):
    """The authority cannot be made or cannot issue (the `openssl` command failed)."""


def name_constraints(hosts: Iterable[str]) -> str:
    """The CA's nameConstraints: the hosts with a secret and nothing else. A kind of name with no
    host is shut outright (OpenSSL and the others leave a kind without a subtree unconstrained),
    so a leaked key impersonates nothing else. Pure."""
    names, addresses = [], []
    for host in sorted(set(hosts)):
        if is_ip(host):
            ip = ipaddress.ip_address(host)
            addresses.append(f"permitted;IP:{ip}/{ipaddress.ip_network(ip).netmask}")
        else:
            names.append(f"permitted;DNS:{host.removeprefix('*.')}")
    # `.invalid` never resolves (RFC 6761): with no name listed, no name passes.
    parts = names or ["permitted;DNS:.invalid"]
    parts += addresses or ["excluded;IP:0.0.0.0/0.0.0.0", "excluded;IP:::/::"]
    return "critical," + ",".join(parts)


def _config(subject: str, extensions: dict[str, str]) -> bytes:
    lines = ["[req]", "distinguished_name = dn", "prompt = no", "x509_extensions = ext"]
    lines += ["[dn]", f"CN = {subject}", "[ext]"]
    lines += [f"{name} = {value}" for name, value in extensions.items()]
    return ("\n".join(lines) + "\n").encode()


async def _openssl(args: list[str], config: bytes) -> None:
    """`openssl req -x509 ...` with its configuration on stdin (no file, no key in an argv)."""
    argv = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
    argv += ["-nodes", "-config", "/dev/stdin", *args]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        msg = f"cannot run openssl to make the egress CA's certificates: {exc.strerror}"
        raise AuthorityError(msg) from None
    _, err = await proc.communicate(config)
    if proc.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        msg = f"openssl failed making a certificate: {last}"
        raise AuthorityError(msg)


class Authority:
    """The CA in `directory` (0700, the sidecar's own; the key 0600) for `hosts`, the normalised
    hosts that have a secret; `context(host)` is the TLS server context for one of them."""

    def __init__(self, directory: Path, hosts: Iterable[str]) -> None:
        self.directory = directory
        self.hosts = tuple(sorted(set(hosts)))
        self.key = directory / "ca.key"
        self.cert = directory / "ca.pem"
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._making: dict[str, asyncio.Task[ssl.SSLContext]] = {}

    @property
    def _scope(self) -> Path:
        return self.directory / "hosts"  # the hosts the CA was made for, one a line

    async def load(self) -> None:
        """Reuse the CA kept in `directory` (a CLI that ran on through a supervisor restart
        trusts it still); make a new one when there is none or the hosts with a secret
        changed (its constraints name them)."""
        os.makedirs(self.directory, 0o700, exist_ok=True)
        os.chmod(self.directory, 0o700)
        scope = "".join(f"{host}\n" for host in self.hosts).encode()
        try:
            kept = read_limited(self._scope, 64 * 1024) == scope
        except OSError:
            kept = False
        if kept and self.key.is_file() and self.cert.is_file():
            return
        for old in self.directory.iterdir():
            old.unlink()  # certificates of the CA replaced
        config = _config(
            "sleeve egress CA",
            {
                "basicConstraints": "critical,CA:TRUE,pathlen:0",
                "keyUsage": "critical,keyCertSign,cRLSign",
                "subjectKeyIdentifier": "hash",
                "nameConstraints": name_constraints(self.hosts),
            },
        )
        out = ["-keyout", str(self.key), "-out", str(self.cert), "-days", str(CA_DAYS)]
        old_mask = os.umask(0o077)  # the key is made 0600 at once, never readable for a moment
        try:
            await _openssl(out, config)
        finally:
            os.umask(old_mask)
        with replacing(self._scope, 0o600) as fd:
            fill(fd, scope, 0o600)
        log.info("egress: made the sleeve's CA for %s", ", ".join(self.hosts))

    def _leaf(self, host: str) -> Path:
        if not _HOST.fullmatch(host):
            msg = f"not a host name: {host!r}"
            raise AuthorityError(msg)
        return self.directory / f"leaf-{host}.pem"

    async def context(self, host: str) -> ssl.SSLContext:
        """The server context presenting `host`'s certificate (made on first use and kept on
        disk; one making at a time per host). AuthorityError when it cannot be made."""
        context = self._contexts.get(host)
        if context is not None:
            return context
        task = self._making.get(host)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._make_context(host))
            self._making[host] = task
            task.add_done_callback(lambda _: self._making.pop(host, None))
        return await asyncio.shield(task)

    async def _make_context(self, host: str) -> ssl.SSLContext:
        leaf = self._leaf(host)
        try:
            fresh = time.time() - leaf.stat().st_mtime < LEAF_RENEW
        except OSError:
            fresh = False
        if not fresh:
            await self._issue(host, leaf)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(leaf)
        context.set_alpn_protocols(["http/1.1"])  # the proxy reads HTTP/1.1 heads, not h2
        if len(self._contexts) >= MAX_LEAVES:
            del self._contexts[next(iter(self._contexts))]
        self._contexts[host] = context
        return context

    async def _issue(self, host: str, leaf: Path) -> None:
        san = f"IP:{host}" if is_ip(host) else f"DNS:{host}"
        config = _config(
            host,
            {
                "basicConstraints": "critical,CA:FALSE",
                "keyUsage": "critical,digitalSignature",
                "extendedKeyUsage": "serverAuth",
                "subjectAltName": san,
                "authorityKeyIdentifier": "keyid",
            },
        )
        kept = sorted(self.directory.glob("leaf-*.pem"), key=lambda p: p.stat().st_mtime)
        for old in kept[: max(0, len(kept) - MAX_LEAVES + 1)]:
            old.unlink(missing_ok=True)
        part = leaf.with_name(f".{leaf.name}.part")
        args = ["-keyout", str(part), "-out", str(part.with_suffix(".cert"))]
        args += ["-days", str(LEAF_DAYS), "-CA", str(self.cert), "-CAkey", str(self.key)]
        old_mask = os.umask(0o077)
        try:
            await _openssl(args, config)
            pem = part.read_bytes() + part.with_suffix(".cert").read_bytes()
        finally:
            os.umask(old_mask)
            for made in (part, part.with_suffix(".cert")):
                made.unlink(missing_ok=True)
        with replacing(leaf, 0o600) as fd:
            fill(fd, pem, 0o600)

    def write_trust(self, public: Path, bundle: Path, extra: Path | None = None) -> None:
        """The files the CLI reads (0644): `public`, the CA's certificate (with `extra`'s, the
        corporate CAs of SIDECAR_EGRESS_CA_FILE), and `bundle`, those after the system's roots
        as Python's ssl finds them. OSError when a file cannot be read or written."""
        own = self.cert.read_bytes()
        if extra is not None:
            own = read_limited(extra, MAX_BUNDLE).rstrip(b"\n") + b"\n" + own
        paths = ssl.get_default_verify_paths()
        system = b""
        for found in (paths.cafile, paths.openssl_cafile):
            if found and os.path.isfile(found):
                system = read_limited(found, MAX_BUNDLE).rstrip(b"\n") + b"\n"
                break
        else:
            log.warning("egress: no system CA bundle found; the CLI trusts the sleeve's CA only")
        for path, data in ((public, own), (bundle, system + own)):
            with replacing(path, 0o644) as fd:
                fill(fd, data, 0o644)


def trust_env(public: Path, bundle: Path) -> dict[str, str]:
    """The CLI's variables that make it trust the sleeve's CA (only when some secret exists):
    the whole bundle for the libraries that replace their roots with a file, the CA alone for
    Node, which adds it to its own. Pure."""
    env = dict.fromkeys(BUNDLE_VARS, str(bundle))
    env[EXTRA_VAR] = str(public)
    return env
