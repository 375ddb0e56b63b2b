"""Scrubbing: what may leave the traffic (profile examples, console lines, text sent to --llm).

Credentials (sk-..., hf_..., Bearer ..., JWTs, api_key=...) are found by `curator.http.redact`,
the toolkit's one list of key shapes, and user:password in URLs by `curator.http.public_url`; this
module adds what identifies a person or a machine: e-mail addresses (any script, fullwidth `＠`,
spaces around the @ and dots, spelled out, "name at example dot com", or half, "name at
example.com"), phone numbers (fullwidth digits, 030/12345678), IP addresses, IBANs (any case),
street addresses (also number first, "12 rue de Rivoli") and UK postcodes, a name introduced as one
("my name is ...", or just before a street address), passwords said in words ("my password is ...",
"my password's ...", `pw=...`) and bare PINs ("my PIN 4821"), short `hf_` tokens, AWS key ids, and
long hex or base64 strings (secrets without a known prefix).

It runs on every request `curator tap` records, so it must stay fast: every pattern is compiled
once and starts only where a run of its characters starts (a start at every position inside a long
run makes a search quadratic), and the e-mail passes run only on text holding an @. It errs towards scrubbing: a version number shaped like an IP address or a commit
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
# (it starts where a run of name characters starts, not at each \b inside it: a.b.c.d... would be quadratic)
_SPELLED_EMAIL = re.compile(rf"(?i)(?<![\w.+-])[\w.+-]+{_AT}[A-Za-z0-9-]+(?:{_SEP}[A-Za-z0-9-]+)*{_SEP}[A-Za-z]{{2,6}}\b")
# two letters, two check digits, then 11-30 letters and digits, maybe in groups of four
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?:[ ]?[A-Z0-9]){11,30}\b")
# the same in lower or mixed case ("de89 3704 0044 ..."), held to an IBAN's layout so that words
# are not swallowed: a bank code of four letters or digits, then digits in groups of four
_IBAN_ANY_CASE = re.compile(r"(?i)\b[a-z]{2}\d{2}[ ]?[a-z0-9]{4}(?:[ ]?\d{4}){1,7}(?:[ ]?\d{1,3})?\b")
_STREET_WORDS = (r"Street|St|Avenue|Ave|Road|Rd|Lane|Ln|Boulevard|Blvd|Drive|Dr|Court|Ct|Way|Place|Pl|Square|Sq|"
                 r"Terrace|Parkway|Pkwy|Highway|Hwy|Close|Crescent|Row|Alley")
# "42 Baker Street", "1600 Pennsylvania Ave NW", "Hauptstraße 5", "rue de Rivoli 10", "Calle Mayor 3"
_STREET = re.compile(
    rf"\b\d{{1,5}}[A-Za-z]?,?\s+(?:[A-Z][\w'-]*\.?\s+){{1,4}}(?:{_STREET_WORDS})\b\.?"
    # (from the start of a hyphenated run only: from each \b inside Ab-Ab-Ab-... the search is quadratic)
    r"|(?<![\w'-])[A-Z][\w'-]*(?i:stra(?:ß|ss)e|gasse|weg|allee|platz)\s+\d{1,5}[a-z]?\b"
    r"|\b(?:[Rr]ue|[Cc]alle|[Vv]ia|[Aa]venida|[Rr]ua)\s+(?:[\w'-]+\s+){1,4}\d{1,5}[a-z]?\b"
    # the number first, as French, Spanish, Italian and Portuguese addresses are also written: "12 rue de Rivoli"
    r"|\b\d{1,5}[A-Za-z]?,?\s+(?i:rue|avenue|boulevard|bd|place|all[ée]e|chemin|quai|impasse|cours|calle|avenida|"
    r"paseo|plaza|via|viale|piazza|corso|rua|travessa)\s+(?:(?i:de|du|des|la|le|les|del|da|do|dos|das|di|della|dei)\s+"
    r"|[LlDd]['\u2019])*[A-ZÀ-ÖØ-Þ][\w'-]*(?:\s+[A-ZÀ-ÖØ-Þ][\w'-]*){0,2}"
)
_NAMED = re.compile(r"(?i)\b(my name is|my name's|name\s*:|i am called|call me)\s+"
                    r"(?-i:[A-Z][\w'-]+(?:\s+[A-Z][\w'-]+){0,3})")
_NAME_BEFORE_ADDRESS = re.compile(r"\b[A-Z][a-z'-]+(?:\s+[A-Z][a-z'-]+){1,3}(?=,?\s+(?:lives\s+at\s+|at\s+)?\[ADDRESS\])")
# a password said in words or a short assignment: "my password is hunter2", "my password's x", "pw=abc", "passwd: x"
_PASSWORD = re.compile(r"(?i)\b((?:pass(?:word|wd|phrase|code)?|pwd|pw|pin)(?:['\u2019]s\b|\s+(?:is|was|=|:)|\s*[:=]))"
                       r"\s*[\"']?[^\s\"',;]+")
# a UK postcode: outward code (area letters, district digit) and inward code ("NW1 6XE", "SW1A 1AA"),
# the part of an address the street pattern leaves after the town
# a PIN or card code given bare: "my PIN 4821", "pin code: 0000", "CVV 123" (the word kept, the digits replaced)
_PIN = re.compile(r"(?i)\b((?:pin|passcode)(?:[ -]?(?:code|number|no\.?))?|cvv2?|cvc2?|security code)(\s*[:#=]?\s*)\d{3,8}\b")
_UK_POSTCODE = re.compile(r"\b[A-Z]{1,2}\d[A-Z\d]?\s+\d[A-Z]{2}\b")
_SHORT_HF = re.compile(r"\bhf_[A-Za-z0-9]{10,}")

# Any script (müller@bücher.de, 用户@例子.公司) and the fullwidth or ideographic @ and dots an IME types
# (ｊａｎｅ＠ｅｘａｍｐｌｅ．ｃｏｍ); a top-level domain is letters, so a version (pkg@1.2.3) stays.
_AT_SIGN = "@\uff20\ufe6b"
_DOTS = ".\uff0e\u3002\uff61"
_EMAIL = re.compile(rf"(?<![\w.+%{_DOTS}-])[\w.+%{_DOTS}-]+[{_AT_SIGN}][\w-]+(?:[{_DOTS}][\w-]+)*[{_DOTS}][^\W\d_]{{2,}}")
# "jane @ example . com": spaces around the @ and the dots, so only with a common top-level domain
# (`x @ w.shape` in numpy code is a matrix product, not an address)
_TLDS = ("com|org|net|edu|gov|mil|int|info|biz|io|co|me|dev|app|ai|uk|de|fr|es|it|nl|be|ch|at|se|no|dk|fi|pl|"
         "pt|ie|cz|ru|ua|cn|jp|kr|in|br|ar|mx|au|nz|ca|us|eu")
_SPACED_EMAIL = re.compile(rf"(?i)(?<![\w.+-])[\w.+-]+\s*[{_AT_SIGN}]\s*[\w-]+(?:\s*[{_DOTS}]\s*[\w-]+)*?"
                           rf"\s*[{_DOTS}]\s*(?:{_TLDS})(?!\w|[{_DOTS}]\w)")
_AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b")
_HEX = re.compile(r"(?<![0-9A-Za-z])[0-9a-fA-F]{32,}(?![0-9A-Za-z])")
# a run of 24+ characters of the base64/url-safe alphabet, judged by _key_like (after "=" too: key=...)
_BASE64 = re.compile(r"(?<![\w+/-])[\w+/-]{24,}={0,2}(?![\w+/=-])")
_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.])")
_IPV6 = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{1,4})?(?:::?[0-9A-Fa-f]{1,4}){2,7}(?:::)?(?![\w:])")
# a run of digit groups, maybe with a +country code and (area code): a phone once it has 9+ digits
# (fullwidth digits are \d; their plus, parentheses and hyphens are listed, and a slash may follow the
# area code: 030/12345678)
_SEPS = r"[\s.\-\uff0d\u2010\u2011\u2013]"
_PHONE = re.compile(rf"(?<![\w.+\uff0b])[+\uff0b]?(?:[(\uff08]\d{{1,4}}[)\uff09]{_SEPS}?)?\d{{1,4}}"
                    rf"(?:{_SEPS}?|\s?[/\uff0f]\s?)[(\uff08]?\d{{1,4}}[)\uff09]?(?:{_SEPS}?[(\uff08]?\d{{1,4}}[)\uff09]?){{1,5}}(?![\w])")


def _ipv6(match: re.Match[str]) -> str:
    text = match.group(0)
    # times (12:30:45) and C++ scopes have no hex letters and few groups; an address has 3+ groups and a digit
    return IP if text.count(":") >= 3 and any(c.isdigit() for c in text) else text


def _key_like(match: re.Match[str]) -> str:
    """Replace a long run of base64 characters that looks random: 24+ mixing upper case, lower case and
    digits; or 32+ (an account key) of upper and lower case letters alone, their cases evenly mixed
    (CamelCase names such as AbstractSingletonProxyFactoryBean are mostly lower case), or of lower
    case letters and digits, several of each, no underscore (snake_case names keep theirs)."""
    text = match.group(0)
    upper = sum(c.isupper() for c in text)
    lower = sum(c.islower() for c in text)
    digits = sum(c.isdigit() for c in text)
    if upper and lower and digits:
        return REDACTED
    if len(text) < 32 or not text.isascii():
        return text
    if upper and lower and 0.25 <= upper / (upper + lower) <= 0.75:
        return REDACTED
    if not upper and digits >= 4 and lower >= 4 and "_" not in text:
        return REDACTED
    return text


def _phone(match: re.Match[str]) -> str:
    text = match.group(0)
    digits = sum(c.isdigit() for c in text)
    return PHONE if digits >= 9 or (text.startswith("+") and digits >= 8) else text


def scrub(text: str) -> str:
    """Return `text` with credentials, secrets, e-mail addresses, IP addresses, phone numbers, IBANs,
    street addresses, UK postcodes and introduced names replaced (the module's list)."""
    text = public_url(text)  # user:password@ in URLs, before the e-mail pattern sees "password@host"
    if any(c in text for c in _AT_SIGN):  # most text has no @: two passes saved
        text = _EMAIL.sub(EMAIL, text)
        text = _SPACED_EMAIL.sub(EMAIL, text)
    text = _SPELLED_EMAIL.sub(EMAIL, text)
    text = redact(text)
    text = _SHORT_HF.sub(REDACTED, text)
    text = _PASSWORD.sub(lambda m: m.group(1) + ("" if m.group(1)[-1] in ":=" else " ") + REDACTED, text)
    text = _PIN.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    text = _IBAN.sub(IBAN, text)
    text = _IBAN_ANY_CASE.sub(IBAN, text)
    text = _STREET.sub(ADDRESS, text)
    text = _UK_POSTCODE.sub(POSTCODE, text)
    text = _NAME_BEFORE_ADDRESS.sub(NAME, text)
    text = _NAMED.sub(lambda m: f"{m.group(1)} {NAME}", text)
    text = _AWS_KEY_ID.sub(REDACTED, text)
    text = _HEX.sub(REDACTED, text)
    text = _BASE64.sub(_key_like, text)
    text = _IPV4.sub(IP, text)
    text = _IPV6.sub(_ipv6, text)
    return _PHONE.sub(_phone, text)
