"""Scrubbing what leaves the traffic, and the non-English heuristic."""

from __future__ import annotations

import time

import pytest

from curator.traffic.language import is_english
from curator.traffic.scrub import scrub


@pytest.mark.parametrize(("text", "secret"), [
    ("write to jane.roe+news@mail.acme-corp.example today", "jane.roe"),
    ("OPENAI_API_KEY=sk-proj-4fQ2mZ8xT1vB7nK3pL9aR6sD0wE5yU", "4fQ2mZ8xT1vB"),
    ("my key is sk-ant-api03-Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2", "Zx9Yw8Vu7"),
    ("token hf_QmRtYpLkJhGfDsAzXcVbNmQwErTy please", "QmRtYpLk"),
    ("curl -H 'Authorization: Bearer abcdef0123456789xyz' https://api", "abcdef0123456789xyz"),
    ("aws AKIAIOSFODNN7EXAMPLE in the config", "AKIAIOSFODNN7EXAMPLE"),
    ("secret = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI"),
    ("session 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b", "9f86d081884c7d659a2f"),
    ("DATABASE_URL=postgres://admin:Sup3rS3cret@db.internal/prod", "Sup3rS3cret"),
    ("call me at +44 20 7946 0958 or (415) 555-0132", "7946"),
    ("the box at 10.42.7.199 and fe80::1ff:fe23:4567:890a", "10.42.7.199"),
    ("the box at 10.42.7.199 and fe80::1ff:fe23:4567:890a", "fe23:4567"),
    # the fault sweep of 2026-12-04 (item 7) found these copied as they were
    ("my password's swordfish123", "swordfish123"),
    ("write to john at example.com", "john"),
    ("I am John Smith, 221B Baker Street, London NW1 6XE", "NW1 6XE"),
    ("I am John Smith, 221B Baker Street, London NW1 6XE", "John Smith"),
    ("the palace is at SW1A 1AA", "SW1A 1AA"),
    # the fault sweep of issue 49 (item 10): shapes the page listed, copied as they were
    ("schreib an müller@bücher.de", "müller"),
    ("schreib an müller@bücher.de", "bücher"),
    ("邮件 用户@例子.公司 谢谢", "例子"),
    ("ｊａｎｅ．ｒｏｅ＠ｅｘａｍｐｌｅ．ｃｏｍ", "ｊａｎｅ"),
    ("ｊａｎｅ．ｒｏｅ＠ｅｘａｍｐｌｅ．ｃｏｍ", "ｅｘａｍｐｌｅ"),
    ("write to jane @ example . com", "jane"),
    ("write to jane.roe @ mail.example.org today", "jane.roe"),
    ("ruf an: 030/12345678", "12345678"),
    ("電話 ０３０－１２３４５６７８ まで", "１２３４５６７８"),
    ("call ＋４９ ３０ １２３４５６７８", "１２３４５６７８"),
    ("my PIN 4821, do not share", "4821"),
    ("iban de89 3704 0044 0532 0130 00 please", "3704 0044"),
    ("iban de89370400440532013000 please", "de89370400440532013000"),
    ("account key abcdEFGHijklMNOPqrstUVWXyzABCDEF", "abcdEFGH"),
    ("key=Kx7fJq2LmN9pRt4VwYz1Ab3Cd5Ef6Gh", "Kx7fJq2L"),
    ("account key k3j5h6g7f8d9s0a1q2w3e4r5t6y7u8i9", "k3j5h6g7"),
    ("I live at 12 rue de Rivoli, Paris", "Rivoli"),
    ("Jane Roe, 12 rue de Rivoli, Paris", "Jane Roe"),
    ("25 avenue des Champs-Élysées", "Champs"),
    ("Karl-Marx-Allee 5, Berlin", "Marx"),
])
def test_secrets_and_personal_data_are_replaced(text: str, secret: str) -> None:
    assert secret not in scrub(text)


def test_the_words_around_a_scrubbed_value_stay() -> None:
    assert scrub("my password's swordfish123") == "my password's [REDACTED]"
    assert scrub("I am John Smith, 221B Baker Street, London NW1 6XE") == "I am [NAME], [ADDRESS], London [POSTCODE]"


def test_ordinary_code_math_and_times_survive() -> None:
    text = ("Solve 2x + 3 = 11 by 12:30:45 on 2023-10-05; std::vector<int> v; a::b::c; pi is 3.14159; "
            "def f(x): return x ** 2")
    assert scrub(text) == text


@pytest.mark.parametrize("text", [
    "y = x @ w.shape; z = a @ b.T",  # a matrix product is not "jane @ example . com"
    "@app.route('/x') and npm i left-pad@1.3.0",
    "class AbstractSingletonProxyFactoryBean extends Object",  # CamelCase is no base64 key
    "def test_case_2023_10_05_migration_0001_final(): pass",
    "from 2023/10/05 to 2024/01/31, 1/2 of 3/4",
    "pin 3 versions of numpy; the 12 rue; Python 3.11.4 on port 8080",
    "py38 and then something else entirely here",
])
def test_code_and_prose_near_the_new_shapes_survive(text: str) -> None:
    assert scrub(text) == text


def test_the_words_around_the_new_shapes_stay() -> None:
    assert scrub("my PIN 4821, thanks") == "my PIN [REDACTED], thanks"
    assert scrub("I live at 12 rue de Rivoli, Paris") == "I live at [ADDRESS], Paris"
    assert scrub("iban de89 3704 0044 0532 0130 00 ok") == "iban [IBAN] ok"


@pytest.mark.parametrize("unit", ["a.", "Ab-", "1", "aB", "f", "a" * 50 + " ", "12 ", "12/", "a @ b . "])
def test_no_input_makes_the_scrubber_quadratic(unit: str) -> None:
    """curator tap scrubs every recorded request: 20 KB shaped against each pattern takes milliseconds
    (a.a.a... with an @ took 11 s, 20 KB of digits or hex 1.5 s, before each pattern started only where a
    run of its characters starts)."""
    text = unit * (20_000 // len(unit)) + " @ x :// y"
    start = time.perf_counter()
    scrub(text)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize(("text", "english"), [
    ("How do I bake bread? I have a recipe in a book.", True),
    ("def f(x): return x", True),
    ("```\nla de en el un\n```\nWhat does this code do?", True),  # code fences do not vote
    ("¿Qué lugares me recomiendas visitar en Madrid?", False),
    ("Schreib mir ein kurzes Gedicht über den Winter.", False),
    ("Comment faire une tarte aux pommes ?", False),
    ("写一个Python函数，计算列表中所有偶数的和。", False),
    ("Привет, как дела?", False),
])
def test_non_english_is_told_by_script_or_function_words(text: str, english: bool) -> None:
    assert is_english(text) is english
