"""The egress allowlist (`sidecar.egress.allowlist`): patterns parsed from the variable's and the
file's spelling, matching on the host name asked for, and every bad pattern refused with the
variable and the pattern named. Pure functions, tested directly."""

from __future__ import annotations

import pytest

from sidecar.egress.allowlist import (
    DEFAULT_PORTS,
    AllowlistError,
    normalise_host,
    parse_list,
    parse_pattern,
    split_file,
    split_value,
)

VAR = "SIDECAR_EGRESS_ALLOW"


def allows(patterns: str, host: str, port: int) -> bool:
    return parse_list(VAR, split_value(patterns)).match(host, port) is not None


def test_variable_splits_on_commas_and_whitespace() -> None:
    assert split_value("a.com, b.com\tc.com\n,,d.com") == ["a.com", "b.com", "c.com", "d.com"]


def test_file_has_one_pattern_per_line_and_comments() -> None:
    text = "# models\napi.anthropic.com  # the API\n\n  *.github.com\n#registry.npmjs.org\n"
    assert split_file(text) == ["api.anthropic.com", "*.github.com"]


@pytest.mark.parametrize(
    ("text", "shown", "host", "wildcard", "ports"),
    [
        ("api.anthropic.com", "api.anthropic.com", "api.anthropic.com", False, DEFAULT_PORTS),
        ("*.GitHub.com", "*.github.com", "github.com", True, DEFAULT_PORTS),
        ("registry.npmjs.org:443", "registry.npmjs.org:443", "registry.npmjs.org", False, (443,)),
        ("127.0.0.1:8443", "127.0.0.1:8443", "127.0.0.1", False, (8443,)),
        ("[::1]:8443", "[::1]:8443", "::1", False, (8443,)),
        ("[0:0::1]", "[::1]", "::1", False, DEFAULT_PORTS),
        ("::1", "[::1]", "::1", False, DEFAULT_PORTS),
        ("example.com.", "example.com", "example.com", False, DEFAULT_PORTS),
        ("bücher.example", "xn--bcher-kva.example", "xn--bcher-kva.example", False, DEFAULT_PORTS),
        ("localhost:65535", "localhost:65535", "localhost", False, (65535,)),
    ],
)
def test_good_patterns(
    text: str, shown: str, host: str, wildcard: bool, ports: tuple[int, ...]
) -> None:
    p = parse_pattern(VAR, text)
    assert (p.text, p.host, p.wildcard, p.ports) == (shown, host, wildcard, ports)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("https://api.anthropic.com", "no scheme"),
        ("http://x:80", "no scheme"),
        ("api.anthropic.com/v1", "no path"),
        ("example.com:443/", "no path"),
        ("*", "bare *"),
        ("*.", "bare *"),
        ("*:443", "bare *"),
        ("*.:443", "bare *"),
        ("a.*.com", "leading '*.'"),
        ("*example.com", "leading '*.'"),
        ("*.*.example.com", "leading '*.'"),
        ("example.*", "leading '*.'"),
        ("10.0.0.0/8", "CIDR"),
        ("[fd00::]/8", "CIDR"),
        ("10.0.0.1-10.0.0.9", "not a host name"),
        ("10.0.0.*", "leading '*.'"),
        ("127.1", "not a host name"),
        ("*.10.0.0.1", "not an IP address"),
        ("example.com:0", "1 to 65535"),
        ("example.com:65536", "1 to 65535"),
        ("example.com:https", "1 to 65535"),
        ("example.com:", "1 to 65535"),
        ("[::1]8443", "[addr]:port"),
        ("[::1", "[addr]:port"),
        ("exa mple.com", "not a host name"),
        ("-bad.example.com", "not a host name"),
        ("under_score..com", "not a host name"),
    ],
)
def test_bad_patterns_name_the_variable_and_the_pattern(text: str, why: str) -> None:
    with pytest.raises(AllowlistError) as err:
        parse_pattern(VAR, text)
    assert str(err.value).startswith(f"{VAR}: pattern {text!r}: ")
    assert why in str(err.value)


def test_empty_list_is_an_error_none_is_nothing_allowed() -> None:
    for items in ([], ["", "  "]):
        with pytest.raises(AllowlistError, match=f"{VAR} is empty; write 'none'"):
            parse_list(VAR, items)
    nothing = parse_list(VAR, ["NONE"])
    assert nothing.patterns == ()
    assert nothing.match("localhost", 443) is None
    with pytest.raises(AllowlistError, match="cannot stand beside patterns"):
        parse_list(VAR, ["none", "example.com"])


def test_repeated_patterns_count_once() -> None:
    assert parse_list(VAR, ["a.com", "A.com.", "a.com:443"]).texts == ["a.com", "a.com:443"]


def test_exact_host_matches_itself_only_on_its_ports() -> None:
    assert allows("example.com", "example.com", 443)
    assert allows("example.com", "example.com", 80)
    assert not allows("example.com", "example.com", 8443)
    assert not allows("example.com", "www.example.com", 443)
    assert not allows("example.com", "example.com.evil.net", 443)
    assert allows("example.com:8443", "example.com", 8443)
    assert not allows("example.com:8443", "example.com", 443)


def test_wildcard_matches_subdomains_only() -> None:
    assert allows("*.github.com", "api.github.com", 443)
    assert allows("*.github.com", "a.b.github.com", 443)
    assert not allows("*.github.com", "github.com", 443)
    assert not allows("*.github.com", "evilgithub.com", 443)
    assert not allows("*.github.com", "github.com.evil.net", 443)


def test_host_asked_for_is_normalised() -> None:
    assert allows("example.com", "EXAMPLE.com.", 443)
    assert allows("bücher.example", "BÜCHER.example", 443)
    assert allows("bücher.example", "xn--bcher-kva.example", 443)
    assert allows("[::1]:8443", "[::1]", 8443)
    assert allows("[::1]:8443", "0:0::1", 8443)
    assert allows("127.0.0.1:8443", "127.0.0.1", 8443)


def test_other_spellings_of_an_address_are_not_it() -> None:
    """getaddrinfo would take these for 127.0.0.1: matching is on the name asked for, and a
    numeric last label is no name, so none of them passes for the listed address."""
    for host in ("127.1", "2130706433", "0x7f.0.0.1", "0177.0.0.1", "127.0.0.1.", ""):
        assert not allows("127.0.0.1:8443", host, 8443) or host == "127.0.0.1."
    assert normalise_host("2130706433") is None
    assert normalise_host("a" * 64 + ".com") is None
