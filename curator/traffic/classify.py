"""The traffic classifier: which category (agentic, code, reasoning, chat) a request belongs to.

Deterministic rules, cheap enough for every row of a large sample:

1. agentic when the request declares tools, carries tool calls or tool results, or writes tool
   calls as markup in its text (Hermes `<tool_call>`, DeepSWE `<function=...>`); these are
   facts of the request, so the decision is sure.
2. otherwise the user text is scored for code (fences, tracebacks, lines of source, "write a
   function" requests, programming words) and reasoning (LaTeX, math symbols, equations,
   "prove"/"step by step", math words), with chat words (poems, e-mails, translation, advice)
   as the counterweight. No signal at all is chat. A category wins surely when it scores at
   least STRONG and at least twice the runner-up; otherwise the decision is unsure, and
   `curator profile --llm` may ask a model about it.

Words are matched at ASCII-letter boundaries, not `\\b`, so that "Python" inside Chinese or
Japanese text still counts.
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
class _Signal:
    name: str
    category: str
    pattern: re.Pattern[str]
    weight: float
    cap: int  # at most this many matches count: one long paste must not outweigh everything


def _words(*words: str) -> str:
    """Return a pattern matching any of `words` (regex fragments) between non-ASCII-letter boundaries."""
    return r"(?<![A-Za-z0-9_])(?:" + "|".join(words) + r")(?![A-Za-z0-9_])"


_I = re.IGNORECASE
_M = re.MULTILINE

SIGNALS: tuple[_Signal, ...] = (
    # --- code
    _Signal("fence", "code", re.compile(r"^\s*```", _M), 2.0, 2),
    _Signal("traceback", "code", re.compile(
        r"Traceback \(most recent call last\)|^\s+at [\w.$<>]+\([\w.]+:\d+\)|\b\w+(?:Error|Exception): "
        r"|error\[E\d{4}\]|Segmentation fault|undefined reference to|npm ERR!|panicked at|error: expected", _M), 3.0, 1),
    _Signal("source-line", "code", re.compile(
        r"^\s*(?:def \w+\(|class \w+[:(\s{]|import [\w.]+|from [\w.]+ import |#include\s*[<\"]|using namespace |"
        r"package \w+|func \w+\(|fn \w+\(|(?:let|const|var) \w+\s*=|(?:public|private|protected|static) \w+|"
        r"return\b.*;|(?:if|for|while|switch) ?\(.*\)\s*\{|SELECT .+ FROM |INSERT INTO |CREATE TABLE |"
        r"(?:SELECT|FROM|WHERE|GROUP BY|ORDER BY|LEFT JOIN|INNER JOIN|UPDATE \w+ SET)\b|"
        r"[a-z_][a-z0-9_]{2,}(?:\.\w+|\[\w+\])*\s*(?:=|\+=|-=)\s*\S|"
        r"\$ [a-z]+|[\w.]*[a-z_]\w*\(.*\)\s*;?\s*$|[\w\].)]+\s*(?:=|\+=|-=|:=)\s*[\w\[{(\"'].*;\s*$|[}]\s*$|.*\{\s*$|</?\w+[^>]*>\s*$)", _M),
        1.0, 6),
    # useEffect, getElementById, snake_case_names, foo(): identifiers, which prose does not have
    _Signal("identifier", "code", re.compile(
        r"(?<![A-Za-z0-9_])(?:[a-z]{2,}[A-Z][A-Za-z0-9]*|[a-z]+_[a-z0-9_]+|[A-Za-z_]\w*\(\))(?![A-Za-z0-9_])"), 1.0, 2),
    _Signal("code-request", "code", re.compile(
        _words("write", "implement", "create", "build", "fix", "debug", "refactor", "optimi[sz]e", "review", "convert",
               "port", "translate")
        + r"[^.?!\n]{0,60}?"
        + _words("function", "functions", "program", "script", "class", "method", "code", "snippet", "query", "regex",
                 "endpoint", "api", "component", "module", "unit tests?", "test cases?", "bug", "makefile",
                 "dockerfile", "cli", "library", "decorator", "struct", "interface", "hook"), _I), 2.5, 2),
    _Signal("language", "code", re.compile(_words(
        "python", "javascript", "typescript", "java", r"c\+\+", "c#", "rust", "golang", "kotlin", "swift", "php",
        "ruby", "scala", "haskell", "sql", "html", "css", "bash", "powershell", "perl", "lua", "dart", "elixir")
        + "|函数|代码|程序|编程|报错", _I), 1.0, 2),
    _Signal("code-words", "code", re.compile(_words(
        "react", "vue", "angular", "django", "flask", "fastapi", r"node\.?js", "npm", "pip", "pandas", "numpy", "pytorch", "regex", "json", "yaml", "docker", "kubernetes",
        "git", "github", "compiler?", "compil(?:e|es|ing|ation)", "debug(?:ging)?", "bug", "variable", "array",
        "recursion", "recursive", "refactor(?:ing)?", "algorithm", "script", "code", "coding", "programming", "library", "framework",
        "database", "backend", "frontend", "stack ?trace", "exception", "runtime", "segfault", "shell",
        "terminal", "linux", "api", "sdk", "repo(?:sitory)?", "pull request", "commit", "merge conflict", "nullptr",
        "null pointer", "async", "thread", "mutex", "deadlock", "memory leak", "big-o", "time complexity",
        "leetcode", "unit tests?", "linter", "idiomatic", "refactor", "webpack", "dependency", "deployment", "server", "localhost",
        "jupyter", "dataframe", "boolean", "integer overflow", "string", "int", "float", "enum", "null", "hash ?maps?",
        "hash ?tables?", "linked lists?", "binary (?:search )?trees?", "data structures?", "pointers?", "div",
        "components?", "closures?", "callbacks?", "promises?", "http", "rest", "graphql", "oauth", "sorting",
        "garbage collect(?:or|ion)", "cache", "index(?:es)?", "schema", "migrations?", "cron", "ssh", "vim",
        "ide", "vs ?code", "stdout", "stdin", "unicode", "utf-8", "websocket"), _I), 0.75, 4),
    # --- reasoning
    _Signal("latex", "reasoning", re.compile(
        r"\\(?:frac|dfrac|sqrt|int|iint|sum|prod|lim|binom|cdot|times|leq?|geq?|neq|infty|mathbb|mathrm|pmod|"
        r"equiv|partial|log|ln|sin|cos|tan|alpha|beta|gamma|theta|lambda|sigma|pi)\b|\\begin\{(?:align|equation|cases|pmatrix)"
        r"|\$[^$\n]{1,80}[=^_+\-][^$\n]{0,80}\$"), 2.0, 3),
    _Signal("math-symbols", "reasoning", re.compile(r"[∫∑∏√≤≥≠≈∞π∂∀∃∈∉⊆⊂∪∩⇒⇔±÷×°²³½¼θ]"), 1.0, 3),
    _Signal("equation", "reasoning", re.compile(
        r"(?<![\w.])\d*[a-z]\s*(?:\^|\*\*)\s*\d|\b\d+\s*[a-z]\s*[-+]\s*\d+\s*=|(?<![\w.])[a-z]\([a-z0-9]\)\s*="
        r"|\b\d+(?:\.\d+)?\s*[-+*/×÷^]\s*\d+(?:\.\d+)?\s*=\s*(?:\?|\d|[a-z]\b)|(?<![\w.])\d+\s*![\s,.?]"
        r"|\d+(?:\.\d+)?\s*%|(?<![\w.])log_?\d*\s*\(|(?<![\w.])[a-z]\s*=\s*-?\d+(?:\.\d+)?\s*(?:,|and|$)", _M), 1.5, 3),
    _Signal("proof-or-steps", "reasoning", re.compile(_words(
        "prove", "proof", "show that", "demonstrate that", "step[- ]by[- ]step", "reason(?:ing)? through",
        "think carefully", "justify your answer", "explain your reasoning", "theorem", "lemma", "corollary",
        "by induction", "contradiction", "q\\.?e\\.?d", "work it out", "show your work",
        # the same asks in the languages the traffic most often carries besides English
        "demuestra", "demostrar", "beweise", "beweisen", "démontrer", "montrer que", "证明", "求解", "推导"), _I), 2.0, 2),
    _Signal("math-words", "reasoning", re.compile(_words(
        "solve", "equations?", "integral", "integrate", "derivative", "differentiate", "probability", "expected value",
        "how many", "how much", "calculate", "compute", "remainder", "divisible", "primes?", "prime numbers?",
        "factori[sz]e", "polynomial", "quadratic", "matrix", "matrices", "eigenvalues?", "vectors?", "geometry",
        "triangles?", "circles?", "radius", "area", "perimeter", "angles?", "sequence", "series", "converges?",
        "limit", "logarithm", "percent(?:age)?", "ratio", "average", "mean", "median", "sum of", "product of",
        "digits?", "integers?", "real numbers?", "fractions?", "inequality", "riddle", "puzzle", "logic(?:al)?",
        "deduce", "infer", "syllogism", "minimum", "maximum", "optimal", "arithmetic", "algebra", "calculus",
        "combinatorics", "permutations?", "combinations?", "odds", "speed", "distance", "rate of", "km/h", "mph",
        "costs? \\$?\\d", "per hour", "in total", "altogether", "twice as", "times as", "older than",
        "years old", "math", "mathematics", "physics", "chemistry", "irrational", "rational", "how far", "how long will",
        "how fast", "estimate", "paradox", "if and only if", "given that", "suppose", "assume",
        "ecuación", "números", "gleichung", "berechne", "geschwindigkeit", "équation", "calcule[rz]?", "方程", "计算",
        "概率"), _I), 0.75, 5),
    _Signal("numbers", "reasoning", re.compile(r"(?<![\w.])\d+(?:[.,]\d+)?(?![\w.])"), 0.25, 6),
    # --- chat
    _Signal("chat-request", "chat", re.compile(
        _words("write", "compose", "draft", "give me", "suggest", "recommend", "tell me", "help me with") + r"[^.?!\n]{0,50}?"
        + _words("poem", "story", "essay", "e-?mail", "letter", "cover letter", "speech", "toast", "blog post", "tweet",
                 "lyrics", "song", "joke", "caption", "slogan", "bio", "review", "summary", "tagline", "names?",
                 "ideas?", "gift", "recipe", "itinerary", "workout", "plan", "message", "description", "advice",
                 "tips"), _I), 2.0, 2),
    _Signal("chat-words", "chat", re.compile(_words(
        "summari[sz]e", "paraphrase", "rephrase", "rewrite", "proofread", "translate", "grammar", "tone",
        "friendly", "formal", "poem", "story", "essay", "novel", "character", "plot", "history", "travel", "trip",
        "vacation", "restaurant", "recipe", "cook(?:ing)?", "movie", "book", "music", "feel(?:ing)?s?", "relationship",
        "friend", "boyfriend", "girlfriend", "wife", "husband", "family", "kids", "birthday", "wedding", "dating",
        "advice", "opinion", "what do you think", "should i", "health", "diet", "exercise", "sleep", "job interview",
        "resume", "career", "marketing", "brand", "instagram", "linkedin", "customer", "meeting", "hello", "hi",
        "thanks", "thank you", "who are you", "how are you", "pros and cons", "compare", "difference between",
        "culture", "politics", "philosophy", "religion", "weather", "pet", "dog", "cat", "garden", "itinerary",
        "things to do"), _I), 0.75, 5),
)

# Tool calls written into the text (requests from clients that render tools themselves).
_TOOL_MARKUP = re.compile(r"<tool_call>|<function=[\w.-]+>|<functioncall>|\"tool_calls\"\s*:|<\|tool_call", _I)
_TOOLS_IN_SYSTEM = re.compile(
    r"(?:you have access to|you can (?:use|call)|available)\s+(?:the following\s+)?(?:tools|functions)\b|<tools>", _I)
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


def scores(text: str) -> tuple[dict[str, float], dict[str, str]]:
    """Return ({category: score}, {category: its strongest signal's name}) for code, reasoning and chat."""
    total = {"code": 0.0, "reasoning": 0.0, "chat": 0.0}
    best: dict[str, tuple[float, str]] = {}
    for signal in SIGNALS:
        hits = 0
        for _ in signal.pattern.finditer(text):
            hits += 1
            if hits >= signal.cap:
                break
        if not hits:
            continue
        gained = hits * signal.weight
        total[signal.category] += gained
        if gained > best.get(signal.category, (0.0, ""))[0]:
            best[signal.category] = (gained, signal.name)
    return total, {cat: name for cat, (_, name) in best.items()}


def classify(messages: list[dict[str, Any]], tools: list[Any] | None) -> Decision:
    """Return the category of one request (its prompt messages and the tools it declares)."""
    found = _agentic(messages, tools)
    if found is not None:
        return found
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
