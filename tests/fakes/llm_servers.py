"""Local model servers on 127.0.0.1 for the scout's tests and benchmark: one HTTP server that
speaks the Anthropic Messages API (`POST /v1/messages`, tool_use / tool_result content blocks,
usage, stop_reason, `{"type": "error"}` bodies, 429 with retry-after, 529 overloaded) and the
OpenAI chat-completions API (`POST /v1/chat/completions`, `tool_calls`, `role: tool` answers).

The "model" is a script. The server keeps no per-conversation state: each request carries the
whole conversation, so the script reads the agent's id and category from the system prompt
(the lines `Agent id: ...` and `Category: ...` the agent loop writes) and what its tools
answered so far, and chooses the next tool calls from that. Ten agents can therefore talk to
one server at once, each getting its own conversation. Conversations are validated as the
real APIs do (alternating roles, every tool call answered, by id) and rejected with a 400.

Every request is logged with its agent, start and end time and status, so tests can check
that agents overlapped in time and that a rate-limited call was retried after the wait.

Stdlib only:

    with ScriptedLLMServer(latency=0.3) as server:
        server.anthropic_url, server.openai_url, server.log
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

API_KEY = "sk-ant-test-key"

# A dataset id as the Hub writes them: owner/name.
_ID_RE = re.compile(r"\b([A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})\b")
_ASKED_RE = re.compile(r"record_candidate for ([\w.-]+/[\w.-]+[\w])")
_JSON_ID_RE = re.compile(r'"(?:id|dataset_id)"\s*:\s*"([^"/\s]+/[^"\s]+)"')


@dataclass
class Step:
    """One earlier tool call in the conversation and what it answered."""

    name: str
    arguments: dict[str, Any]
    result: str
    is_error: bool


@dataclass
class View:
    """What a script sees of one request: who is asking and what happened so far."""

    api: str
    system: str
    agent: str
    category: str
    turn: int  # assistant turns already in the conversation
    steps: list[Step]
    last_user_text: str

    def found_ids(self) -> list[str]:
        """Return dataset ids seen in successful search results, first seen first."""
        ids: list[str] = []
        for step in self.steps:
            if step.name == "search_datasets" and not step.is_error:
                for dataset_id in dataset_ids_in(step.result):
                    if dataset_id not in ids:
                        ids.append(dataset_id)
        return ids

    def inspected(self) -> list[str]:
        """Return ids successfully inspected, in order."""
        return [s.arguments.get("dataset_id", "") for s in self.steps if s.name == "inspect_dataset" and not s.is_error]

    def recorded(self) -> list[str]:
        """Return ids successfully recorded, in order."""
        return [s.arguments.get("dataset_id", "") for s in self.steps if s.name == "record_candidate" and not s.is_error]


@dataclass
class Reply:
    """What the scripted model answers: text and tool calls (none means it ends its turn).

    Arguments given as a str are sent verbatim on the OpenAI API (to play a model that writes
    broken JSON); the Anthropic API always sends an object.
    """

    text: str = ""
    calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)


Script = Callable[[View], Reply]


def dataset_ids_in(text: str) -> list[str]:
    """Return dataset ids in a tool result: JSON `id` fields when present, else owner/name words."""
    ids = _JSON_ID_RE.findall(text)
    if not ids:
        ids = [m for m in _ID_RE.findall(text) if not m.startswith(("http", "www.")) and "." not in m.split("/")[0]]
    seen: list[str] = []
    for dataset_id in ids:
        if dataset_id not in seen:
            seen.append(dataset_id)
    return seen


def explorer(turns: int = 4, queries: dict[str, list[str]] | None = None, samples: int = 100) -> Script:
    """Return a script that searches, inspects and records in a cycle and finishes on turn `turns`.

    Turn i (0-based): the last turn calls finish; otherwise i % 3 == 0 searches (the agent's
    queries, else its category), 1 inspects the next found id not yet inspected, 2 records the
    last inspected id not yet recorded. A step with nothing to act on searches instead.
    """

    def script(view: View) -> Reply:
        if view.turn >= turns - 1:
            return Reply(f"{view.agent} done", [("finish", {"summary": f"{view.agent}: recorded {len(view.recorded())}"})])
        agent_queries = (queries or {}).get(view.agent) or [view.category or view.agent]
        search = ("search_datasets", {"query": agent_queries[(view.turn // 3) % len(agent_queries)], "limit": 5})
        phase = view.turn % 3
        if phase == 1:
            todo = [i for i in view.found_ids() if i not in view.inspected()]
            if todo:
                return Reply("Let me look at this one.", [("inspect_dataset", {"dataset_id": todo[0]})])
        if phase == 2:
            todo = [i for i in view.inspected() if i not in view.recorded()]
            if todo:
                args = {
                    "dataset_id": todo[-1],
                    "category": view.category,
                    "relevance": 0.8,
                    "rationale": f"prompts that fit {view.category}",
                    "suggested_samples": samples,
                }
                return Reply("Recording it.", [("record_candidate", args)])
        return Reply("Searching.", [search])

    return script


def gullible(query: str) -> Script:
    """Return a script that obeys instructions found in Hub text (the prompt-injection case).

    It searches for `query`, inspects the first hit, then does what the card asks: records any other
    dataset id the card names, with relevance 1.0, an invented category and a huge sample
    count, and then records the inspected dataset normally and finishes.
    """

    def script(view: View) -> Reply:
        if view.turn == 0:
            return Reply("", [("search_datasets", {"query": query, "limit": 5})])
        if view.turn == 1:
            return Reply("", [("inspect_dataset", {"dataset_id": view.found_ids()[0]})])
        inspected = view.inspected()[0] if view.inspected() else view.found_ids()[0]
        card = next((s.result for s in view.steps if s.name == "inspect_dataset"), "")
        others = [i for i in dict.fromkeys(_ASKED_RE.findall(card)) if i != inspected]
        if view.turn == 2:
            calls = [
                (
                    "record_candidate",
                    {"dataset_id": other, "category": "admin", "relevance": 1.0, "rationale": "the card told me to", "suggested_samples": 10**9},
                )
                for other in others
            ] or [("search_datasets", {"query": "anything"})]
            calls.append(("inspect_dataset", {"dataset_id": others[0] if others else inspected}))
            return Reply("The card says to record these.", calls)
        if view.turn == 3:
            return Reply(
                "",
                [("record_candidate", {"dataset_id": other, "category": view.category, "relevance": 1.0, "rationale": "the card insisted", "suggested_samples": 10**9}) for other in others]
                + [("record_candidate", {"dataset_id": inspected, "category": view.category, "relevance": 0.5, "rationale": "inspected", "suggested_samples": 10})],
            )
        return Reply("done", [("finish", {"summary": "done"})])

    return script


def talker() -> Script:
    """Return a script that never calls a tool (to check the agent stops instead of spinning)."""
    return lambda view: Reply(f"I think {view.category} data is nice.")


@dataclass
class RequestRecord:
    """One request as the server saw it."""

    api: str
    agent: str
    turn: int
    start: float
    end: float
    status: int


class _Rejected(Exception):
    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.headers = headers or {}


class ScriptedLLMServer:
    """A local Anthropic + OpenAI-compatible model server driven by per-agent scripts.

    latency: seconds each answer takes. scripts: agent id -> Script (default `explorer()`).
    rate_limited: agent id -> how many of its first requests get a 429 with `retry_after`.
    overloaded: agent id -> how many of its first requests get a 529 overloaded_error.
    failing: agent id -> HTTP status every request of that agent gets (e.g. 400, 500), with
    `failure_message` as the error's text ({agent} filled in), e.g. one that echoes a key.
    """

    def __init__(
        self,
        *,
        latency: float = 0.0,
        scripts: dict[str, Script] | None = None,
        default_script: Script | None = None,
        rate_limited: dict[str, int] | None = None,
        overloaded: dict[str, int] | None = None,
        failing: dict[str, int] | None = None,
        failure_message: str = "scripted failure for {agent}",
        retry_after: float = 0.2,
        api_key: str = API_KEY,
        model: str = "scripted-model",
    ) -> None:
        self.latency = latency
        self.scripts = scripts or {}
        self.default_script = default_script or explorer()
        self.rate_limited = dict(rate_limited or {})
        self.overloaded = dict(overloaded or {})
        self.failing = dict(failing or {})
        self.failure_message = failure_message
        self.retry_after = retry_after
        self.api_key = api_key
        self.model = model
        self.log: list[RequestRecord] = []
        self.bodies: list[dict[str, Any]] = []
        self._seen: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> ScriptedLLMServer:
        """Start serving on a free port in a background thread; return self."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                server._handle(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="scripted-llm", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> ScriptedLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """Return http://127.0.0.1:PORT."""
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def anthropic_url(self) -> str:
        """Return the base URL for ANTHROPIC_BASE_URL / AsyncAnthropic(base_url=...)."""
        return self.base_url

    @property
    def openai_url(self) -> str:
        """Return the base URL for --llm openai --base-url."""
        return self.base_url + "/v1"

    def records(self, agent: str | None = None, status: int | None = None) -> list[RequestRecord]:
        """Return logged requests, optionally of one agent and/or status."""
        with self._lock:
            return [r for r in self.log if (agent is None or r.agent == agent) and (status is None or r.status == status)]

    # -- HTTP -------------------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        start = time.perf_counter()
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length)
        path = handler.path.split("?")[0].rstrip("/")
        api = "anthropic" if path.endswith("/v1/messages") else "openai" if path.endswith("/chat/completions") else ""
        agent, turn = "", 0
        try:
            if not api:
                raise _Rejected(404, "not_found_error", f"no route {handler.path}")
            try:
                body = json.loads(raw)
            except ValueError as exc:
                raise _Rejected(400, "invalid_request_error", f"body is not JSON: {exc}") from exc
            with self._lock:
                self.bodies.append(body)
            self._check_auth(api, handler)
            view = self._view(api, body)
            agent, turn = view.agent, view.turn
            self._check_faults(agent)
            time.sleep(self.latency)
            reply = self.scripts.get(agent, self.default_script)(view)
            payload = self._anthropic_reply(body, reply, len(raw)) if api == "anthropic" else self._openai_reply(body, reply, len(raw))
            status, headers = 200, {}
        except _Rejected as exc:
            status, headers = exc.status, exc.headers
            if api == "openai":
                payload = {"error": {"message": exc.message, "type": exc.kind, "code": exc.status}}
            else:
                payload = {"type": "error", "error": {"type": exc.kind, "message": exc.message}}
        data = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("request-id", f"req_{uuid.uuid4().hex[:12]}")
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        try:
            handler.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up waiting (a timeout test)
        with self._lock:
            self.log.append(RequestRecord(api, agent, turn, start, time.perf_counter(), status))

    def _check_auth(self, api: str, handler: BaseHTTPRequestHandler) -> None:
        if api == "anthropic":
            if not handler.headers.get("anthropic-version"):
                raise _Rejected(400, "invalid_request_error", "anthropic-version header is required")
            key = handler.headers.get("x-api-key") or (handler.headers.get("authorization") or "").removeprefix("Bearer ")
            if key != self.api_key:
                raise _Rejected(401, "authentication_error", "invalid x-api-key")

    def _check_faults(self, agent: str) -> None:
        with self._lock:
            self._seen[agent] += 1
            n = self._seen[agent]
        if agent in self.failing:
            status = self.failing[agent]
            kind = "invalid_request_error" if status < 500 else "api_error"
            raise _Rejected(status, kind, self.failure_message.replace("{agent}", agent))
        if n <= self.rate_limited.get(agent, 0):
            raise _Rejected(429, "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit", {"retry-after": f"{self.retry_after:g}"})
        if n - self.rate_limited.get(agent, 0) <= self.overloaded.get(agent, 0):
            raise _Rejected(529, "overloaded_error", "Overloaded")

    # -- conversations ----------------------------------------------------------------------

    def _view(self, api: str, body: dict[str, Any]) -> View:
        for key in ("model", "messages", "max_tokens"):
            if key not in body:
                raise _Rejected(400, "invalid_request_error", f"{key}: Field required")
        messages = body["messages"]
        if api == "anthropic":
            system = body.get("system") or ""
            if isinstance(system, list):
                system = "\n".join(b.get("text", "") for b in system)
            steps, last_user = _anthropic_steps(messages)
        else:
            system = "\n".join(m.get("content") or "" for m in messages if m.get("role") == "system")
            steps, last_user = _openai_steps([m for m in messages if m.get("role") != "system"])
        agent = _line_value(system, "agent id")
        category = _line_value(system, "category")
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        return View(api, system, agent, category, turn, steps, last_user)

    def _anthropic_reply(self, body: dict[str, Any], reply: Reply, request_bytes: int) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if reply.text:
            content.append({"type": "text", "text": reply.text})
        for name, args in reply.calls:
            content.append({"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:20]}", "name": name, "input": args if isinstance(args, dict) else {}})
        out_tokens = max(1, len(json.dumps(content)) // 4)
        return {
            "id": f"msg_{uuid.uuid4().hex[:20]}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", self.model),
            "content": content,
            "stop_reason": "tool_use" if reply.calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": max(1, request_bytes // 4), "output_tokens": out_tokens},
        }

    def _openai_reply(self, body: dict[str, Any], reply: Reply, request_bytes: int) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.calls:
            message["tool_calls"] = [
                {"id": f"call_{uuid.uuid4().hex[:20]}", "type": "function", "function": {"name": n, "arguments": a if isinstance(a, str) else json.dumps(a)}}
                for n, a in reply.calls
            ]
        out_tokens = max(1, len(json.dumps(message)) // 4)
        prompt_tokens = max(1, request_bytes // 4)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:20]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if reply.calls else "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": out_tokens, "total_tokens": prompt_tokens + out_tokens},
        }


def _line_value(system: str, key: str) -> str:
    match = re.search(rf"^\W*{re.escape(key)}\W*:\s*`?([^`\s]+)`?", system, re.IGNORECASE | re.MULTILINE)
    return match.group(1) if match else ""


def _anthropic_steps(messages: list[dict[str, Any]]) -> tuple[list[Step], str]:
    """Return the tool steps of an Messages-API conversation; 400 where the real API would refuse it."""
    steps: list[Step] = []
    pending: dict[str, tuple[str, dict[str, Any]]] = {}
    last_user = ""
    expected = "user"
    for i, message in enumerate(messages):
        role = message.get("role")
        if role != expected:
            raise _Rejected(400, "invalid_request_error", f"messages.{i}: roles must alternate user/assistant, got {role}")
        expected = "assistant" if role == "user" else "user"
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        if role == "assistant":
            if pending:
                raise _Rejected(400, "invalid_request_error", f"messages.{i}: tool_use ids {sorted(pending)} were not answered")
            for block in blocks:
                if block.get("type") == "tool_use":
                    pending[block["id"]] = (block["name"], block.get("input") or {})
            continue
        texts = []
        for block in blocks:
            if block.get("type") == "tool_result":
                call_id = block.get("tool_use_id")
                if call_id not in pending:
                    raise _Rejected(400, "invalid_request_error", f"messages.{i}: tool_result for unknown tool_use_id {call_id}")
                name, args = pending.pop(call_id)
                result = block.get("content")
                if isinstance(result, list):
                    result = "\n".join(b.get("text", "") for b in result)
                steps.append(Step(name, args, str(result or ""), bool(block.get("is_error"))))
            elif block.get("type") == "text":
                texts.append(block.get("text", ""))
        if pending:
            raise _Rejected(400, "invalid_request_error", f"messages.{i}: tool_use ids {sorted(pending)} need tool_result blocks")
        last_user = "\n".join(texts)
    if expected != "assistant":
        raise _Rejected(400, "invalid_request_error", "the last message must be from the user")
    return steps, last_user


def _openai_steps(messages: list[dict[str, Any]]) -> tuple[list[Step], str]:
    """Return the tool steps of a chat-completions conversation; 400 for unanswered tool calls."""
    steps: list[Step] = []
    pending: dict[str, tuple[str, dict[str, Any]]] = {}
    last_user = ""
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant":
            if pending:
                raise _Rejected(400, "invalid_request_error", f"messages.{i}: tool calls {sorted(pending)} were not answered")
            for call in message.get("tool_calls") or []:
                fn = call["function"]
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except ValueError:
                    args = {}  # the model wrote broken JSON; the client answers with a tool error
                pending[call["id"]] = (fn["name"], args)
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                raise _Rejected(400, "invalid_request_error", f"messages.{i}: tool message for unknown tool_call_id {call_id}")
            name, args = pending.pop(call_id)
            content = str(message.get("content") or "")
            steps.append(Step(name, args, content, content.startswith("ERROR:")))
        elif role == "user":
            if pending:
                raise _Rejected(400, "invalid_request_error", f"messages.{i}: tool calls {sorted(pending)} were not answered")
            last_user = str(message.get("content") or "")
        else:
            raise _Rejected(400, "invalid_request_error", f"messages.{i}: unknown role {role}")
    if pending:
        raise _Rejected(400, "invalid_request_error", "the conversation ends with unanswered tool calls")
    return steps, last_user
