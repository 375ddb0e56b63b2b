"""Scrubbing what leaves the traffic, and the non-English heuristic."""

from __future__ import annotations

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
