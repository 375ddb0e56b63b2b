"""A labelled synthetic traffic sample: request-log records with known categories.

For the tests (do the rules recover the shares?), the profile benchmark, and the demo's own
traffic file. The phrasings were written as users write requests, independently of the
classifier's word lists, and mix the cases the rules find hard: code questions without code,
math word problems without symbols, chat that mentions numbers or programs, several turns,
system prompts, other languages, and logs wrapped as `{"body": ...}`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

from curator.traffic.schema import CATEGORIES

LABEL = "label"  # the record key that holds the true category (never read by the classifier)

_LANGS = ["Python", "JavaScript", "TypeScript", "Go", "Rust", "Java", "C++", "C#", "Kotlin", "Ruby", "PHP", "SQL"]
_TASKS = ["parse a CSV file and sum one column", "deduplicate a list while keeping order", "retry an HTTP call with backoff",
          "read a config file with defaults", "merge two sorted arrays", "validate an e-mail field in a form",
          "paginate results from a REST endpoint", "cache the results of a slow lookup", "walk a directory tree",
          "rate-limit incoming requests", "serialize a nested object", "stream a large file line by line"]
_SNIPPETS = [
    "def load(path):\n    with open(path) as f:\n        return json.load(f)\n\nprint(load('cfg.json')['name'])",
    "const total = items.reduce((acc, x) => acc + x.price, 0);\nconsole.log(total.toFixed(2));",
    "for (int i = 0; i <= n; i++) {\n    sum += arr[i];\n}\nreturn sum;",
    "SELECT u.name, COUNT(o.id)\nFROM users u LEFT JOIN orders o ON o.user_id = u.id\nGROUP BY u.name;",
    "fn main() {\n    let v = vec![1, 2, 3];\n    let s: i32 = v.iter().sum();\n    println!(\"{}\", s);\n}",
    "func handler(w http.ResponseWriter, r *http.Request) {\n    fmt.Fprintf(w, \"ok\")\n}",
]
_ERRORS = ["TypeError: 'NoneType' object is not subscriptable", "java.lang.NullPointerException",
           "error[E0382]: borrow of moved value: `v`", "Uncaught ReferenceError: user is not defined",
           "KeyError: 'id'", "Segmentation fault (core dumped)"]
_CODE_ASKS = [
    "Write a {lang} function to {task}.",
    "How would I {task} in {lang}? Keep it idiomatic.",
    "Can you review this and tell me what's wrong?\n```\n{snippet}\n```",
    "I get this when I run my script:\n{error}\nWhat does it mean and how do I fix it?",
    "Refactor this to be more readable:\n\n{snippet}",
    "What's the difference between a process and a thread in {lang}?",
    "Explain what this does line by line:\n```{lang_lower}\n{snippet}\n```",
    "Add unit tests for a {lang} class that needs to {task}.",
    "My {lang} build fails with `{error}` after upgrading dependencies. Ideas?",
    "Is there a cleaner way to {task}? Right now I have:\n{snippet}",
    "Convert this code to {lang}:\n{snippet}",
    "How do I set up a git pre-commit hook that runs the linter?",
]
_MATH = [
    "Solve for x: {a}x + {b} = {c}.",
    "A shop sells pens at ${a} each and notebooks at ${b} each. Maria buys {c} pens and 2 notebooks. How much does she pay?",
    "Prove that the sum of the first n odd numbers is n^2.",
    "What is the derivative of x^{a} * sin(x)?",
    "Evaluate \\int_0^1 x^{a} \\, dx.",
    "A train leaves at 9:00 going {a} km/h; another leaves an hour later at {c} km/h. When does the second catch up?",
    "If I roll two fair dice, what is the probability that the sum is {b}?",
    "Show that √2 is irrational.",
    "Find all integers n such that n^2 - {a}n + {b} = 0.",
    "Tom is {a} years older than his sister. In {b} years he will be twice her age. How old is she now?",
    "Think step by step: a bat and a ball cost $1.10 in total and the bat costs $1 more than the ball. What does the ball cost?",
    "What is the remainder when 7^{c} is divided by {b}?",
    "Three friends split a bill of ${c} so that one pays twice as much as each of the others. How much does each pay?",
    "Is the series sum 1/n^{a} convergent? Justify your answer.",
    "Compute the determinant of the matrix [[{a}, {b}], [{c}, 1]].",
    "If all bloops are razzies and all razzies are lazzies, are all bloops definitely lazzies? Explain your reasoning.",
]
_CHAT = [
    "Write a short poem about {topic}.",
    "Can you draft a polite e-mail to my landlord about {topic}?",
    "What are some fun things to do in {city} with kids?",
    "Give me three ideas for a birthday party themed around {topic}.",
    "How do I stay motivated when working from home?",
    "Summarize the main arguments for and against {topic}.",
    "What should I cook tonight if I only have eggs, spinach and rice?",
    "Tell me a joke about {topic}.",
    "I feel nervous about my job interview tomorrow. Any advice?",
    "Rewrite this sentence to sound more formal: 'we gotta move the meeting, sorry'.",
    "Who was the first person to reach the South Pole?",
    "What's a good name for a bakery in {city}?",
    "Recommend a few novels similar to {book}.",
    "Plan a 3-day itinerary for {city}.",
    "Explain the plot of {book} without spoilers.",
    "What is the capital of {country}, and what is it known for?",
]
_TOPICS = ["autumn", "the ocean", "coffee", "remote work", "city gardens", "space travel", "a noisy neighbour", "dinosaurs",
           "the four-day work week", "electric cars"]
_CITIES = ["Lisbon", "Kyoto", "Chicago", "Nairobi", "Oslo", "Buenos Aires", "Hanoi", "Edinburgh"]
_BOOKS = ["Dune", "Pride and Prejudice", "The Hobbit", "Beloved", "One Hundred Years of Solitude"]
_COUNTRIES = ["Canada", "Peru", "Vietnam", "Ghana", "Finland", "New Zealand"]
_FOREIGN = {  # (category, text): what users outside English write
    "code": ["写一个Python函数，计算列表中所有偶数的和。", "¿Cómo puedo leer un archivo JSON en JavaScript?\n```js\nconst data = require('./data.json');\n```",
             "Wie behebe ich diesen Fehler?\nKeyError: 'name'"],
    "reasoning": ["求解方程 3x + 5 = 20。", "Demuestra que la suma de dos números pares es par.",
                  "Ein Zug fährt 120 km in 1,5 Stunden. Wie hoch ist die Durchschnittsgeschwindigkeit?"],
    "chat": ["请推荐几本适合初学者的历史书。", "¿Qué lugares me recomiendas visitar en Madrid?", "Schreib mir ein kurzes Gedicht über den Winter."],
}
_SYSTEMS = ["You are a helpful assistant.", "You are a concise assistant. Answer briefly.", ""]
_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "run_shell", "description": "Run a shell command in the sandbox",
                                      "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "search_docs", "description": "Search the product documentation",
                                      "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}},
]
_AGENT_ASKS = ["What's the weather in {city} right now?", "Find out why the tests fail in this repo and fix them.",
               "Look up how to rotate an API key in our docs.", "List the files in the project root.",
               "Book a table for two in {city} tomorrow at 7pm."]


def _fill(template: str, rng: random.Random) -> str:
    lang = rng.choice(_LANGS)
    return template.format(
        lang=lang, lang_lower=lang.lower(), task=rng.choice(_TASKS), snippet=rng.choice(_SNIPPETS),
        error=rng.choice(_ERRORS), a=rng.randint(2, 9), b=rng.randint(2, 12), c=rng.randint(13, 90),
        topic=rng.choice(_TOPICS), city=rng.choice(_CITIES), book=rng.choice(_BOOKS), country=rng.choice(_COUNTRIES),
    )


def _ask(category: str, rng: random.Random) -> str:
    if rng.random() < 0.08:
        return rng.choice(_FOREIGN[category])
    pool = {"code": _CODE_ASKS, "reasoning": _MATH, "chat": _CHAT}[category]
    return _fill(rng.choice(pool), rng)


def _agentic(rng: random.Random) -> dict[str, Any]:
    ask = _fill(rng.choice(_AGENT_ASKS), rng)
    tools = rng.sample(_TOOLS, rng.randint(1, 3))
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent. Use the tools."},
                                      {"role": "user", "content": ask}]
    shape = rng.random()
    if shape < 0.45 or shape >= 0.9:  # a later step of the loop: the call made and its result
        name = tools[0]["function"]["name"]
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": name, "arguments": json.dumps({"q": "x"})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"ok": true, "items": 3}'}]
    # some clients log the conversation without the tools they declared
    return {"messages": messages} if shape >= 0.9 else {"messages": messages, "tools": tools}


def _conversation(category: str, rng: random.Random) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    system = rng.choice(_SYSTEMS)
    if system:
        messages.append({"role": "system", "content": system})
    for turn in range(1 if rng.random() < 0.7 else rng.randint(2, 4)):
        if turn:
            messages.append({"role": "assistant", "content": "Sure, here is what I found."})
        messages.append({"role": "user", "content": _ask(category, rng)})
    return {"messages": messages}


def records(n: int, shares: dict[str, float], seed: int = 0) -> Iterator[dict[str, Any]]:
    """Yield `n` request-log records whose categories follow `shares`; each carries its true category under LABEL.

    About a fifth are wrapped as a request-log middleware writes them (`{"body": {...}}`).
    """
    unknown = set(shares) - set(CATEGORIES)
    if unknown:
        raise ValueError(f"unknown categories {sorted(unknown)}")
    rng = random.Random(seed)
    names, weights = list(shares), list(shares.values())
    for _ in range(n):
        category = rng.choices(names, weights)[0]
        request = _agentic(rng) if category == "agentic" else _conversation(category, rng)
        request = {"model": "target", **request, "temperature": 0.7}
        record = {"body": request, "ts": 1700000000 + rng.randint(0, 10**6)} if rng.random() < 0.2 else request
        yield {**record, LABEL: category}


def write_jsonl(path: Any, n: int, shares: dict[str, float], seed: int = 0) -> dict[str, int]:
    """Write `records(n, shares, seed)` to `path` (JSON Lines); return the true rows per category."""
    counts = dict.fromkeys(shares, 0)
    with open(path, "w", encoding="utf-8") as fh:
        for record in records(n, shares, seed):
            counts[record[LABEL]] += 1
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    return counts
