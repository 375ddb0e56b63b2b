"""The traffic classifier: which category (agentic, code, reasoning, chat) a request belongs to.

Deterministic rules, cheap enough for every row of a large sample:

1. agentic when the request declares tools, carries tool calls or tool results, or writes tool
   calls as markup in its text (Hermes `<tool_call>`, DeepSWE `<function=...>`); these are
   facts of the request, so the decision is sure.
2. otherwise the user text is scored for code (fences, tracebacks, lines of source, "write a
   function" requests, signatures with docstrings, programming words) and reasoning (LaTeX, math symbols, equations,
   "prove"/"step by step", math words), with chat words (poems, e-mails, translation, advice)
   as the counterweight. A request verb's first object decides its category ("write a function"
   is code, "write a poem" chat). No signal at all is chat. A category wins surely when it scores at
   least STRONG and at least twice the runner-up; otherwise the decision is unsure, and
   `curator profile --llm` may ask a model about it.

Word lists are matched on the text's words (Latin letters and digits; anything else separates
them, so that "Python" inside Chinese text still counts), phrases in scripts without spaces as
substrings; regexes run only on text that holds a character they need. A row costs tens of
microseconds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from curator.traffic.schema import CATEGORIES

STRONG = 3.0  # a score this high (and twice the runner-up) is a sure decision
_TEXT_CHARS = 16_000  # the last 16K characters of user text decide: cost stays bounded per row


@dataclass(frozen=True)
class Decision:
    """A category, the rule that chose it (e.g. "code:fence"), and whether the rules are sure."""

    category: str
    rule: str
    sure: bool

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"unknown category {self.category!r}")


@dataclass(frozen=True)
class _Pattern:
    """A regex signal; skipped unless the text holds one of `needs` (a substring test is far cheaper)."""

    name: str
    category: str
    weight: float
    cap: int  # at most this many matches count: one long paste must not outweigh everything
    pattern: re.Pattern[str]
    needs: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Words:
    """A word-list signal: phrases of lower-case words, matched on the text's tokens (CJK ones as substrings)."""

    name: str
    category: str
    weight: float
    cap: int
    phrases: tuple[str, ...]


@dataclass(frozen=True)
class _Request:
    """A verb followed within `window` words by a noun: "write ... a function", "draft ... an e-mail"."""

    name: str
    category: str
    weight: float
    cap: int
    verbs: frozenset[str]
    nouns: frozenset[str]
    window: int = 8


def _split(words: str) -> tuple[str, ...]:
    return tuple(w.replace("_", " ") for w in words.split())


_M = re.MULTILINE
# Words: ASCII and Latin letters, digits and the characters of c++, c#, node.js, km/h, e-mail, utf-8.
# Anything else (CJK, spaces, punctuation) separates them, so "写一个Python函数" yields "python".
_TOKEN = re.compile(r"[a-z0-9_+#\u00c0-\u024f]+(?:[./'-][a-z0-9_+#\u00c0-\u024f]+)*")

SIGNALS: tuple[_Pattern | _Words | _Request, ...] = (
    # --- code
    _Pattern("fence", "code", 2.0, 2, re.compile(r"^\s*```", _M), ("```",)),
    _Pattern("traceback", "code", 3.0, 1, re.compile(
        r"Traceback \(most recent call last\)|^\s+at [\w.$<>]+\([\w.]+:\d+\)|\b\w+(?:Error|Exception): "
        r"|error\[E\d{4}\]|Segmentation fault|undefined reference to|npm ERR!|panicked at|error: expected", _M),
        ("Traceback", "Error", "Exception", "error", "fault", "npm ERR", "panicked", "\tat ", "    at ")),
    _Pattern("source-line", "code", 1.0, 6, re.compile(
        r"^\s*(?:def \w+\(|class \w+[:(\s{]|import [\w.]+|from [\w.]+ import |#include\s*[<\"]|using namespace |"
        r"package \w+|func \w+\(|fn \w+\(|(?:let|const|var) \w+\s*=|(?:public|private|protected|static) \w+|"
        r"return\b.*;|(?:if|for|while|switch) ?\(.*\)\s*\{|"
        r"(?:SELECT|FROM|WHERE|GROUP BY|ORDER BY|LEFT JOIN|INNER JOIN|INSERT INTO|CREATE TABLE|UPDATE \w+ SET)\b|"
        r"[a-z_][a-z0-9_]{2,}(?:\.\w+|\[\w+\])*\s*(?:=|\+=|-=)\s*\S|"
        r"\$ [a-z]+|[\w.]*[a-z_]\w*\(.*\)\s*;?\s*$|[\w\].)]+\s*(?:=|\+=|-=|:=)\s*[\w\[{(\"'].*;\s*$|[}]\s*$|.*\{\s*$"
        r"|</?\w+[^>]*>\s*$)", _M)),
    # a function's signature followed by its docstring: a completion request (HumanEval-style) whose
    # docstring prose is full of math words ("sum", "integer", "prime") that must not outvote it
    _Pattern("stub", "code", 3.0, 1, re.compile(
        r"^\s*(?:async )?def \w+\(.*\)\s*(?:->[^:\n]*)?:\s*\n\s*(?:[rbu]?\"\"\"|[rbu]?\'\'\')", _M), ("def ",)),
    _Pattern("doctest", "code", 1.0, 2, re.compile(r"^\s*>>> \S", _M), (">>> ",)),
    # useEffect, getElementById, snake_case_names, foo(): identifiers, which prose does not have
    _Pattern("identifier", "code", 1.0, 2, re.compile(
        r"(?<![A-Za-z0-9_])(?:[a-z]{2,}[A-Z][A-Za-z0-9]*|[a-z]+_[a-z0-9_]+|[A-Za-z_]\w*\(\))(?![A-Za-z0-9_])")),
    _Request("code-request", "code", 3.0, 2,
             frozenset(_split("write implement create build fix debug refactor optimize optimise review convert port "
                              "translate")),
             frozenset(_split("function functions program script class method code snippet query regex endpoint api "
                              "component module test tests testcase cases bug makefile dockerfile cli library decorator "
                              "struct interface hook"))),
    _Words("language", "code", 1.0, 2, _split(
        "python javascript typescript java c++ c# rust golang kotlin swift php ruby scala haskell sql html css bash "
        "powershell perl lua dart elixir 函数 代码 程序 编程 报错")),
    _Words("code-words", "code", 0.75, 4, _split(
        "react vue angular django flask fastapi node.js nodejs npm pip pandas numpy pytorch regex json yaml docker "
        "kubernetes git github compiler compile compiles compiling compilation debug debugging bug variable array "
        "recursion recursive refactor refactoring algorithm script code coding programming library framework database "
        "backend frontend stack_trace stacktrace exception runtime segfault shell terminal linux api sdk repo repository "
        "pull_request commit merge_conflict nullptr null_pointer async thread mutex deadlock memory_leak big-o "
        "time_complexity leetcode unit_test unit_tests linter idiomatic webpack dependency deployment server localhost "
        "jupyter dataframe boolean integer_overflow string int float enum null hash_map hashmap hash_maps hashmaps "
        "hash_table hashtable hash_tables linked_list linked_lists binary_tree binary_trees binary_search_tree "
        "data_structure data_structures pointer pointers div component components closure closures callback callbacks "
        "promise promises http rest graphql oauth sorting garbage_collector garbage_collection cache index indexes schema "
        "migration migrations cron ssh vim ide vs_code vscode stdout stdin unicode utf-8 websocket")),
    # --- reasoning
    _Pattern("latex", "reasoning", 2.0, 3, re.compile(
        r"\\(?:frac|dfrac|sqrt|int|iint|sum|prod|lim|binom|cdot|times|leq?|geq?|neq|infty|mathbb|mathrm|pmod|"
        r"equiv|partial|log|ln|sin|cos|tan|alpha|beta|gamma|theta|lambda|sigma|pi)\b|\\begin\{(?:align|equation|cases|pmatrix)"
        r"|\$[^$\n]{1,80}[=^_+\-][^$\n]{0,80}\$"), ("\\", "$")),
    _Pattern("math-symbols", "reasoning", 1.0, 3, re.compile(r"[∫∑∏√≤≥≠≈∞π∂∀∃∈∉⊆⊂∪∩⇒⇔±÷×°²³½¼θ]")),
    _Pattern("equation", "reasoning", 1.5, 3, re.compile(
        r"(?<![\w.])\d*[a-z]\s*(?:\^|\*\*)\s*\d|\b\d+\s*[a-z]\s*[-+]\s*\d+\s*=|(?<![\w.])[a-z]\([a-z0-9]\)\s*="
        r"|\b\d+(?:\.\d+)?\s*[-+*/×÷^]\s*\d+(?:\.\d+)?\s*=\s*(?:\?|\d|[a-z]\b)|(?<![\w.])\d+\s*![\s,.?]"
        r"|\d+(?:\.\d+)?\s*%|(?<![\w.])log_?\d*\s*\(|(?<![\w.])[a-z]\s*=\s*-?\d+(?:\.\d+)?\s*(?:,|and|$)", _M),
        ("=", "^", "**", "!", "%", "log")),
    _Words("proof-or-steps", "reasoning", 2.0, 2, _split(
        "prove proof show_that demonstrate_that step_by_step step-by-step reason_through reasoning_through "
        "think_carefully justify_your_answer explain_your_reasoning theorem lemma corollary by_induction contradiction "
        "qed q.e.d work_it_out show_your_work "
        # the same asks in the languages the traffic most often carries besides English
        "demuestra demostrar beweise beweisen démontrer montrer_que 证明 求解 推导")),
    _Words("math-words", "reasoning", 0.75, 5, _split(
        "solve equation equations integral integrate derivative differentiate probability expected_value how_many "
        "how_much calculate compute remainder divisible prime primes prime_number prime_numbers factorize factorise "
        "polynomial quadratic matrix matrices eigenvalue eigenvalues vector vectors geometry triangle triangles circle "
        "circles radius area perimeter angle angles sequence series converge converges limit logarithm percent "
        "percentage ratio average mean median sum_of product_of digit digits integer integers real_number real_numbers "
        "fraction fractions inequality riddle puzzle logic logical deduce infer syllogism minimum maximum optimal "
        "arithmetic algebra calculus combinatorics permutation permutations combination combinations odds speed "
        "distance rate_of km/h mph per_hour in_total altogether twice_as times_as older_than years_old math mathematics "
        "physics chemistry irrational rational how_far how_long_will how_fast estimate paradox if_and_only_if given_that "
        "suppose assume ecuación números gleichung berechne geschwindigkeit équation calcule calculer calculez "
        "方程 计算 概率")),
    _Pattern("numbers", "reasoning", 0.25, 6, re.compile(r"(?<![\w.])\d+(?:[.,]\d+)?(?![\w.])")),
    # --- chat
    _Request("chat-request", "chat", 2.0, 2,
             frozenset(_split("write compose draft give suggest recommend tell help")),
             frozenset(_split("poem story essay email e-mail letter speech toast post tweet lyrics song joke caption "
                              "slogan bio review summary tagline name names idea ideas gift recipe itinerary workout plan "
                              "message description advice tips"))),
    _Words("chat-words", "chat", 0.75, 5, _split(
        "summarize summarise paraphrase rephrase rewrite proofread translate grammar tone friendly formal poem story "
        "essay novel character plot history travel trip vacation restaurant recipe cook cooking movie book music feel "
        "feels feeling feelings relationship friend boyfriend girlfriend wife husband family kids birthday wedding "
        "dating advice opinion what_do_you_think should_i health diet exercise sleep job_interview resume career "
        "marketing brand instagram linkedin customer meeting hello hi thanks thank_you who_are_you how_are_you "
        "pros_and_cons compare difference_between culture politics philosophy religion weather pet dog cat garden "
        "itinerary things_to_do")),
)


def _phrase_index() -> tuple[dict[str, list[tuple[tuple[str, ...], int]]], list[tuple[str, int]]]:
    """Return {first word: [(the phrase's other words, signal index)]} and the [(substring, signal index)] of CJK phrases."""
    by_first: dict[str, list[tuple[tuple[str, ...], int]]] = {}
    substrings: list[tuple[str, int]] = []
    for i, signal in enumerate(SIGNALS):
        if not isinstance(signal, _Words):
            continue
        for phrase in signal.phrases:
            words = tuple(_TOKEN.findall(phrase))
            if words and " ".join(words) == phrase:
                by_first.setdefault(words[0], []).append((words[1:], i))
            else:  # written in a script without spaces between words
                substrings.append((phrase, i))
    return by_first, substrings


_BY_FIRST, _SUBSTRINGS = _phrase_index()
_REQUESTS = {i: s for i, s in enumerate(SIGNALS) if isinstance(s, _Request)}
# A verb can belong to several requests ("write a function" is code, "write a poem" chat): its object decides.
_VERBS: dict[str, tuple[int, ...]] = {}
for _i, _s in _REQUESTS.items():
    for _verb in _s.verbs:
        _VERBS[_verb] = (*_VERBS.get(_verb, ()), _i)
_WINDOW = max(s.window for s in _REQUESTS.values())
# one look-up per word: the phrases it starts and the request signals it is a verb of
_ENTRIES = {w: (_BY_FIRST.get(w, []), _VERBS.get(w, ())) for w in {*_BY_FIRST, *_VERBS}}
_PATTERNS = [(i, s) for i, s in enumerate(SIGNALS) if isinstance(s, _Pattern)]

# Tool calls written into the text (requests from clients that render tools themselves).
_TOOL_MARKUP = re.compile(r"<tool_call>|<function=[\w.-]+>|<functioncall>|\"tool_calls\"\s*:|<\|tool_call", re.I)
_TOOLS_IN_SYSTEM = re.compile(
    r"(?:you have access to|you can (?:use|call)|available)\s+(?:the following\s+)?(?:tools|functions)\b|<tools>", re.I)
_REACT = re.compile(r"^\s*Action(?: Input)?:.*$(?s:.*)^\s*Observation:", _M)


def _agentic(messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None) -> Decision | None:
    if tools:
        return Decision("agentic", "agentic:tools-declared", True)
    for m in messages:
        if m.get("tool_calls"):
            return Decision("agentic", "agentic:tool-calls", True)
        if m.get("role") in ("tool", "function", "ipython"):
            return Decision("agentic", "agentic:tool-results", True)
    for m in messages:
        content = m.get("content")
        if not isinstance(content, str):
            continue
        if m.get("role") == "system" and _TOOLS_IN_SYSTEM.search(content):
            return Decision("agentic", "agentic:tools-in-system", True)
        if m.get("role") == "assistant" and _TOOL_MARKUP.search(content):
            return Decision("agentic", "agentic:tool-markup", True)
        if _REACT.search(content):
            return Decision("agentic", "agentic:react", False)
    return None


def user_text(messages: Sequence[dict[str, Any]], limit: int = _TEXT_CHARS) -> str:
    """Return the user turns' text joined by blank lines: its last `limit` characters (the latest ask decides)."""
    parts = [m["content"] for m in messages if m.get("role") == "user" and isinstance(m.get("content"), str)]
    text = "\n\n".join(parts)
    return text[-limit:] if len(text) > limit else text


def _hits(text: str) -> list[int]:
    """Return how often each signal fires in `text` (before caps)."""
    hits = [0] * len(SIGNALS)
    for i, signal in _PATTERNS:
        if not signal.needs or any(n in text for n in signal.needs):
            for _ in signal.pattern.finditer(text):
                hits[i] += 1
                if hits[i] >= signal.cap:
                    break
    tokens = _TOKEN.findall(text.lower())
    for j, token in enumerate(tokens):
        entry = _ENTRIES.get(token)
        if entry is None:
            continue
        phrases, verb_of = entry
        for rest, i in phrases:
            if not rest or tuple(tokens[j + 1 : j + 1 + len(rest)]) == rest:
                hits[i] += 1
        if verb_of:
            # the verb's first object in the window names the request: "write a function that parses a
            # CSV file" is code however many chat nouns follow, "write a poem about recursion" is chat
            for k, t in enumerate(tokens[j + 1 : j + 1 + _WINDOW]):
                owner = next((i for i in verb_of if k < _REQUESTS[i].window and t in _REQUESTS[i].nouns), None)
                if owner is not None:
                    hits[owner] += 1
                    break
    for phrase, i in _SUBSTRINGS:
        hits[i] += text.count(phrase)
    return hits


def scores(text: str) -> tuple[dict[str, float], dict[str, str]]:
    """Return ({category: score}, {category: its strongest signal's name}) for code, reasoning and chat."""
    total = {"code": 0.0, "reasoning": 0.0, "chat": 0.0}
    best: dict[str, tuple[float, str]] = {}
    for signal, n in zip(SIGNALS, _hits(text)):
        if not n:
            continue
        gained = min(n, signal.cap) * signal.weight
        total[signal.category] += gained
        if gained > best.get(signal.category, (0.0, ""))[0]:
            best[signal.category] = (gained, signal.name)
    return total, {cat: name for cat, (_, name) in best.items()}


def classify(messages: list[dict[str, Any]], tools: list[Any] | None, text: str | None = None) -> Decision:
    """Return the category of one request (its prompt messages and the tools it declares); `text` is
    `user_text(messages)` where the caller has it already."""
    found = _agentic(messages, tools)
    if found is not None:
        return found
    if text is None:
        text = user_text(messages)
    total, why = scores(text)
    ranked = sorted(total.items(), key=lambda kv: (-kv[1], ("code", "reasoning", "chat").index(kv[0])))
    (first, top), (_, second) = ranked[0], ranked[1]
    if top == 0.0:
        return Decision("chat", "chat:no-signal", bool(text.strip()))
    if top < 1.0 and first != "chat":  # a number or one stray word is no evidence of code or math
        return Decision("chat", f"chat:weak-{first}", False)
    if first == "chat":
        # chat needs no evidence of its own: it is sure whenever code and reasoning have next to none
        return Decision("chat", f"chat:{why['chat']}", second <= 1.0 or top >= 2 * second)
    sure = top >= STRONG and top >= 2 * second
    return Decision(first, f"{first}:{why[first]}", sure)
