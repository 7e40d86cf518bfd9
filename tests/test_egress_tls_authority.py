"""The sleeve's CA (`sidecar.egress.authority`), made by the real `openssl` command line: kept
private and reused across restarts, constrained to the hosts with a secret (a certificate its
key signs for any other name or address is refused by a verifier), and the trust files and
variables the CLI gets."""

from __future__ import annotations

import os
import ssl
import stat
import subprocess
from pathlib import Path

import pytest

from sidecar.egress import authority as authority_module
from sidecar.egress.authority import Authority, AuthorityError, name_constraints, trust_env
from tests.tls_pki import openssl
from tests.tools import require_executable


@pytest.fixture(autouse=True)
def _openssl() -> None:
    require_executable("openssl", "Debian's openssl package (ca-certificates depends on it)")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_the_ca_is_private_and_kept_across_restarts(tmp_path: Path) -> None:
    directory = tmp_path / "egress-ca"
    first = Authority(directory, ["api.example"])
    await first.load()
    assert (mode(directory), mode(first.key)) == (0o700, 0o600)
    await first.context("api.example")
    leaf = directory / "leaf-api.example.pem"
    assert mode(leaf) == 0o600
    cert, made = first.cert.read_bytes(), leaf.stat().st_mtime_ns
    # A supervisor started again: the same CA (the CLI running on trusts it), the same leaf.
    again = Authority(directory, ["api.example"])
    await again.load()
    await again.context("api.example")
    assert again.cert.read_bytes() == cert and leaf.stat().st_mtime_ns == made
    # Another set of hosts with a secret: a new CA (its constraints name them), old leaves gone.
    other = Authority(directory, ["api.example", "git.example"])
    await other.load()
    assert other.cert.read_bytes() != cert and not leaf.exists()


def issue_with_the_key(authority: Authority, tmp: Path, san: str) -> Path:
    """A certificate for `san` signed with the CA's key, as a thief of the key would make."""
    key, csr, cert = tmp / f"{san}.key", tmp / f"{san}.csr", tmp / f"{san}.pem"
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(key), "-out", str(csr), "-config", "/dev/stdin")  # fmt: skip
    openssl("x509", "-req", "-in", str(csr), "-CA", str(authority.cert), "-CAkey",
            str(authority.key), "-days", "30", "-out", str(cert), "-extfile", "/dev/stdin",
            config=f"subjectAltName={san}\n".encode())  # fmt: skip
    return cert


def verify(authority: Authority, cert: Path) -> str:
    done = subprocess.run(
        ["openssl", "verify", "-CAfile", str(authority.cert), str(cert)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout + done.stderr


@pytest.mark.parametrize(
    ("san", "passes"),
    [
        ("DNS:api.example", True),
        ("DNS:eu.api.example", True),  # a subdomain of a listed name (a `*.` pattern's hosts)
        ("DNS:github.com", False),
        ("DNS:api.example.evil", False),
        ("IP:127.0.0.1", False),  # no address listed: every address is shut
        ("IP:::1", False),
    ],
)
async def test_a_leaked_key_impersonates_only_the_hosts_with_a_secret(
    tmp_path: Path, san: str, passes: bool
) -> None:
    authority = Authority(tmp_path / "egress-ca", ["api.example"])
    await authority.load()
    out = verify(authority, issue_with_the_key(authority, tmp_path, san))
    assert ("OK" in out) is passes, out
    if not passes:
        assert "subtree violation" in out, out


async def test_an_address_with_a_secret_is_permitted_alone(tmp_path: Path) -> None:
    authority = Authority(tmp_path / "egress-ca", ["127.0.0.1"])
    await authority.load()
    assert "OK" in verify(authority, issue_with_the_key(authority, tmp_path, "IP:127.0.0.1"))
    assert "OK" not in verify(authority, issue_with_the_key(authority, tmp_path, "IP:127.0.0.2"))
    assert "OK" not in verify(authority, issue_with_the_key(authority, tmp_path, "DNS:x.example"))
    assert name_constraints(["127.0.0.1"]) == (
        "critical,permitted;DNS:.invalid,permitted;IP:127.0.0.1/255.255.255.255"
    )


async def test_the_trust_files_hold_the_system_roots_and_the_sleeve_ca(tmp_path: Path) -> None:
    authority = Authority(tmp_path / "egress-ca", ["api.example"])
    await authority.load()
    corporate_ca = Authority(tmp_path / "corporate", ["corp.example"])  # a CA of its own
    await corporate_ca.load()
    corporate = corporate_ca.cert
    public, bundle = tmp_path / "egress-ca.pem", tmp_path / "egress-ca-bundle.pem"
    authority.write_trust(public, bundle, extra=corporate)
    assert (mode(public), mode(bundle)) == (0o644, 0o644)
    own = authority.cert.read_bytes()
    assert public.read_bytes() == corporate.read_bytes() + own
    assert bundle.read_bytes().endswith(public.read_bytes())
    system = ssl.get_default_verify_paths().cafile
    assert system is not None
    assert bundle.read_bytes().startswith(Path(system).read_bytes().rstrip(b"\n"))
    # Every certificate in the bundle loads: the CLI's libraries read it as one file.
    ssl.create_default_context(cafile=bundle)
    env = trust_env(public, bundle)
    assert env == {
        "SSL_CERT_FILE": str(bundle),
        "REQUESTS_CA_BUNDLE": str(bundle),
        "CURL_CA_BUNDLE": str(bundle),
        "GIT_SSL_CAINFO": str(bundle),
        "NODE_EXTRA_CA_CERTS": str(public),
    }


async def test_without_openssl_the_authority_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without the command
    with pytest.raises(AuthorityError, match="cannot run openssl"):
        await Authority(tmp_path / "egress-ca", ["api.example"]).load()
    assert os.listdir(tmp_path / "egress-ca") == []  # nothing half made


async def test_a_host_name_never_becomes_a_path(tmp_path: Path) -> None:
    authority = Authority(tmp_path / "egress-ca", ["api.example"])
    await authority.load()
    with pytest.raises(AuthorityError, match="not a host name"):
        await authority.context("../../x")


async def test_the_hosts_certificates_kept_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A secret for a whole domain lets the agent ask for any name in it: the oldest
    certificates go, on disk and in memory."""
    monkeypatch.setattr(authority_module, "MAX_LEAVES", 3)
    authority = Authority(tmp_path / "egress-ca", ["api.example"])
    await authority.load()
    for n in range(5):
        await authority.context(f"h{n}.api.example")
    kept = sorted(p.name for p in (tmp_path / "egress-ca").glob("leaf-*.pem"))
    assert kept == ["leaf-h2.api.example.pem", "leaf-h3.api.example.pem", "leaf-h4.api.example.pem"]
    assert list(authority._contexts) == ["h2.api.example", "h3.api.example", "h4.api.example"]
