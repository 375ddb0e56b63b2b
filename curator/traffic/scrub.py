"""Scrubbing: what may leave the traffic (profile examples, console lines, text sent to --llm).

Credentials (sk-..., hf_..., Bearer ..., JWTs, api_key=...) are found by `curator.http.redact`,
the toolkit's one list of key shapes, and user:password in URLs by `curator.http.public_url`; this
module adds what identifies a person or a machine: e-mail addresses (also spelled out, "name at
example dot com", or half, "name at example.com"), phone numbers, IP addresses, IBANs, street
addresses and UK postcodes, a name introduced as one ("my name is ...", or just before a street
address), passwords said in words ("my password is ...", "my password's ...", `pw=...`), short
`hf_` tokens, AWS key ids, and long hex or base64 strings (secrets without a
known prefix). It errs towards scrubbing: a version number shaped like an IP address or a commit
hash is lost from an example, which costs nothing. Free text it cannot recognise (a name
mentioned in passing) is not found: docs/traffic.md says so, and `curator profile --no-examples`
keeps every example out.
"""

from __future__ import annotations

import re

from curator.http import REDACTED, public_url, redact

EMAIL = "[EMAIL]"
PHONE = "[PHONE]"
IP = "[IP]"
IBAN = "[IBAN]"
ADDRESS = "[ADDRESS]"
NAME = "[NAME]"
POSTCODE = "[POSTCODE]"

_AT = r"(?:\s*[(\[{<]\s*at\s*[)\]}>]\s*|\s+at\s+)"
_DOT = r"(?:\s*[(\[{<]\s*dot\s*[)\]}>]\s*|\s+dot\s+)"
_SEP = rf"(?:{_DOT}|\.)"  # a dot spelled out or written: "john at example.com" is half spelled out
# "jane at example dot com", "jane (at) mail [dot] example [dot] org", "john at example.com"
_SPELLED_EMAIL = re.compile(rf"(?i)\b[\w.+-]+{_AT}[A-Za-z0-9-]+(?:{_SEP}[A-Za-z0-9-]+)*{_SEP}[A-Za-z]{{2,6}}\b")
# two letters, two check digits, then 11-30 letters and digits, maybe in groups of four
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?:[ ]?[A-Z0-9]){11,30}\b")
_STREET_WORDS = (r"Street|St|Avenue|Ave|Road|Rd|Lane|Ln|Boulevard|Blvd|Drive|Dr|Court|Ct|Way|Place|Pl|Square|Sq|"
                 r"Terrace|Parkway|Pkwy|Highway|Hwy|Close|Crescent|Row|Alley")
# "42 Baker Street", "1600 Pennsylvania Ave NW", "Hauptstraße 5", "rue de Rivoli 10", "Calle Mayor 3"
_STREET = re.compile(
    rf"\b\d{{1,5}}[A-Za-z]?,?\s+(?:[A-Z][\w'-]*\.?\s+){{1,4}}(?:{_STREET_WORDS})\b\.?"
    r"|\b[A-Z][\w'-]*(?:stra(?:ß|ss)e|gasse|weg|allee|platz)\s+\d{1,5}[a-z]?\b"
    r"|\b(?:[Rr]ue|[Cc]alle|[Vv]ia|[Aa]venida|[Rr]ua)\s+(?:[\w'-]+\s+){1,4}\d{1,5}[a-z]?\b"
)
_NAMED = re.compile(r"(?i)\b(my name is|my name's|name\s*:|i am called|call me)\s+"
                    r"(?-i:[A-Z][\w'-]+(?:\s+[A-Z][\w'-]+){0,3})")
_NAME_BEFORE_ADDRESS = re.compile(r"\b[A-Z][a-z'-]+(?:\s+[A-Z][a-z'-]+){1,3}(?=,?\s+(?:lives\s+at\s+|at\s+)?\[ADDRESS\])")
# a password said in words or a short assignment: "my password is hunter2", "my password's x", "pw=abc", "passwd: x"
_PASSWORD = re.compile(r"(?i)\b((?:pass(?:word|wd|phrase|code)?|pwd|pw|pin)(?:['\u2019]s\b|\s+(?:is|was|=|:)|\s*[:=]))"
                       r"\s*[\"']?[^\s\"',;]+")
# a UK postcode: outward code (area letters, district digit) and inward code ("NW1 6XE", "SW1A 1AA"),
# the part of an address the street pattern leaves after the town
_UK_POSTCODE = re.compile(r"\b[A-Z]{1,2}\d[A-Z\d]?\s+\d[A-Z]{2}\b")
_SHORT_HF = re.compile(r"\bhf_[A-Za-z0-9]{10,}")

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
    """Return `text` with credentials, secrets, e-mail addresses, IP addresses, phone numbers, IBANs,
    street addresses, UK postcodes and introduced names replaced (the module's list)."""
    text = public_url(text)  # user:password@ in URLs, before the e-mail pattern sees "password@host"
    text = _EMAIL.sub(EMAIL, text)
    text = _SPELLED_EMAIL.sub(EMAIL, text)
    text = redact(text)
    text = _SHORT_HF.sub(REDACTED, text)
    text = _PASSWORD.sub(lambda m: m.group(1) + ("" if m.group(1)[-1] in ":=" else " ") + REDACTED, text)
    text = _IBAN.sub(IBAN, text)
    text = _STREET.sub(ADDRESS, text)
    text = _UK_POSTCODE.sub(POSTCODE, text)
    text = _NAME_BEFORE_ADDRESS.sub(NAME, text)
    text = _NAMED.sub(lambda m: f"{m.group(1)} {NAME}", text)
    text = _AWS_KEY_ID.sub(REDACTED, text)
    text = _HEX.sub(REDACTED, text)
    text = _BASE64.sub(REDACTED, text)
    text = _IPV4.sub(IP, text)
    text = _IPV6.sub(_ipv6, text)
    return _PHONE.sub(_phone, text)
