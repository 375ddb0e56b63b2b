"""Scrubbing: what may leave the traffic (profile examples, console lines, text sent to --llm).

Credentials (sk-..., hf_..., Bearer ..., JWTs, api_key=...) are found by `curator.http.redact`,
the toolkit's one list of key shapes, and user:password in URLs by `curator.http.public_url`; this
module adds what identifies a person or a machine: e-mail addresses, phone numbers, IP addresses,
AWS key ids, and long hex or base64 strings (secrets without a known prefix). It errs towards
scrubbing: a version number shaped like an IP address or a commit hash is lost from an example,
which costs nothing.
"""

from __future__ import annotations

import re

from curator.http import REDACTED, public_url, redact

EMAIL = "[EMAIL]"
PHONE = "[PHONE]"
IP = "[IP]"

_EMAIL = re.compile(r"[\w.+%-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
_AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b")
_HEX = re.compile(r"(?<![0-9A-Za-z])[0-9a-fA-F]{32,}(?![0-9A-Za-z])")
# 24+ characters of base64/url-safe alphabet mixing upper case, lower case and digits
_BASE64 = re.compile(r"(?<![\w+/=-])(?=[\w+/-]*[A-Z])(?=[\w+/-]*[a-z])(?=[\w+/-]*\d)[\w+/-]{24,}={0,2}(?![\w+/=-])")
_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.])")
_IPV6 = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{1,4})?(?:::?[0-9A-Fa-f]{1,4}){2,7}(?:::)?(?![\w:])")
# a run of digit groups, maybe with a +country code and (area code): a phone once it has 9+ digits
_PHONE = re.compile(r"(?<![\w.+])\+?(?:\(\d{1,4}\)[\s.-]?)?\d{1,4}(?:[\s.-]?\(?\d{1,4}\)?){2,6}(?![\w])")


def _ipv6(match: re.Match[str]) -> str:
    text = match.group(0)
    # times (12:30:45) and C++ scopes have no hex letters and few groups; an address has 3+ groups and a digit
    return IP if text.count(":") >= 3 and any(c.isdigit() for c in text) else text


def _phone(match: re.Match[str]) -> str:
    text = match.group(0)
    digits = sum(c.isdigit() for c in text)
    return PHONE if digits >= 9 or (text.startswith("+") and digits >= 8) else text


def scrub(text: str) -> str:
    """Return `text` with credentials, secrets, e-mail addresses, IP addresses and phone numbers replaced."""
    text = public_url(text)  # user:password@ in URLs, before the e-mail pattern sees "password@host"
    text = _EMAIL.sub(EMAIL, text)
    text = redact(text)
    text = _AWS_KEY_ID.sub(REDACTED, text)
    text = _HEX.sub(REDACTED, text)
    text = _BASE64.sub(REDACTED, text)
    text = _IPV4.sub(IP, text)
    text = _IPV6.sub(_ipv6, text)
    return _PHONE.sub(_phone, text)
