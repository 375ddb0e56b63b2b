"""`curator profile`: shares recovered from labelled traffic, statistics, nothing personal copied out,
malformed lines counted, the optional LLM pass against local servers speaking the real APIs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from curator.cli import main
from curator.errors import ConfigError
from curator.traffic.profile import EXAMPLES_PER_CATEGORY, build_profile
from curator.traffic.schema import CATEGORIES, load_profile
from curator.traffic.synthetic import write_jsonl
from tests.fakes.llm_servers import API_KEY, Reply, ScriptedLLMServer, View
from training.errors import ConfigFileError

SHARES = {"agentic": 0.2, "code": 0.3, "reasoning": 0.2, "chat": 0.3}


def run_profile(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["profile", *argv])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_profile_recovers_the_shares_and_prints_them_within_80_columns(tmp_path: Path, capsys) -> None:
    truth = write_jsonl(tmp_path / "traffic.jsonl", 1500, SHARES, seed=11)
    code, console = run_profile(["--traffic", str(tmp_path / "traffic.jsonl"), "--out", str(tmp_path / "p.json")], capsys)
    assert code == 0, console
    profile = load_profile(tmp_path / "p.json")
    for cat in CATEGORIES:
        assert abs(profile.categories[cat].share - truth[cat] / 1500) < 0.03, (cat, truth, profile.categories)
    assert sum(c.rows for c in profile.categories.values()) == 1500
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["decided"]["rules"] == 1500 and data["decided"]["llm"] == 0
    assert data["length"]["unit"] == "characters" and data["context"]["unit"].startswith("estimated tokens")
    assert 0.15 < data["tool_use"]["rate"] < 0.25  # the agentic share: every agentic row declares or calls tools
    assert 0.01 < data["non_english"]["share"] < 0.15
    assert data["turns"]["max"] >= 2 and 0 < data["turns"]["multi_turn"] < 0.5
    assert all(len(v) == EXAMPLES_PER_CATEGORY for v in data["examples"].values())
    assert set(profile.features.per_category) == set(CATEGORIES)
    assert all(len(line) <= 80 for line in console.splitlines()), max(console.splitlines(), key=len)
    assert "traffic by category" in console and "█" in console and "characters" in console


SECRETS = {
    "email": "jane.roe@acme-corp.example",
    "openai": "sk-proj-4fQ2mZ8xT1vB7nK3pL9aR6sD0wE5yU",
    "anthropic": "sk-ant-api03-Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2",
    "hf": "hf_QmRtYpLkJhGfDsAzXcVbNmQwErTy",
    "bearer": "Bearer eyJ0eXAiOiJKV1QiLCJhbGciOiJIUzI1NiJ9abc",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "hex": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b",
    "b64": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "phone": "+44 20 7946 0958",
    "phone_us": "(415) 555-0132",
    "ip": "10.42.7.199",
    "url_password": "postgres://admin:Sup3rS3cret@db.internal/prod",
}
# the parts that must never appear (the Bearer token without the word, the URL password alone)
NEEDLES = [v.removeprefix("Bearer ") for k, v in SECRETS.items() if k != "url_password"] + ["Sup3rS3cret", "acme-corp"]


def _planted(tmp_path: Path) -> Path:
    """Traffic where every request of every category carries every secret, in user text and system prompt."""
    path = tmp_path / "traffic.jsonl"
    write_jsonl(path, 200, SHARES, seed=5)
    leak = " ".join(f"{k}: {v}" for k, v in SECRETS.items())
    values = list(SECRETS.values())
    lines = []
    for i, line in enumerate(path.read_text().splitlines()):
        record = json.loads(line)
        request = record.get("body", record)
        request["messages"].insert(0, {"role": "system", "content": f"Deployment notes: {leak}"})
        for m in request["messages"]:
            if m["role"] == "user":  # one secret first (so that it lands in a short example), all of them after
                m["content"] = f"{values[i % len(values)]} {m['content']}\n{leak}"
        lines.append(json.dumps(record))
    # a malformed line quoting a secret: its reason must not carry it either
    lines.append(json.dumps({"messages": [{"role": SECRETS["openai"], "content": "x"}]}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_secrets_and_personal_data_never_reach_the_profile_or_the_console(tmp_path: Path, capsys) -> None:
    traffic = _planted(tmp_path)
    code, console = run_profile(["--traffic", str(traffic), "--out", str(tmp_path / "p.json")], capsys)
    assert code == 0, console
    written = (tmp_path / "p.json").read_text()
    examples = json.loads(written)["examples"]
    assert sum(len(v) for v in examples.values()) >= 8  # examples were written, scrubbed
    assert sum(marker in written for marker in ("[EMAIL]", "[REDACTED]", "[PHONE]", "[IP]")) >= 3
    for needle in NEEDLES:
        assert needle not in written, needle
        assert needle not in console, needle


def test_malformed_lines_are_counted_and_shown_and_an_unreadable_file_is_one_error(tmp_path: Path, capsys) -> None:
    traffic = tmp_path / "t.jsonl"
    good = json.dumps({"messages": [{"role": "user", "content": "Write a poem about rain."}]})
    wizard = json.dumps({"messages": [{"role": "wizard", "content": "x"}]})
    traffic.write_text("\n".join([good, "{oops", json.dumps({"model": "m"}), good, "[]", wizard]) + "\n")
    code, console = run_profile(["--traffic", str(traffic), "--out", str(tmp_path / "p.json")], capsys)
    data = json.loads((tmp_path / "p.json").read_text())
    assert code == 0 and data["rows"] == 2 and data["malformed"] == 4
    assert data["malformed_reasons"] == {"broken JSON line": 1, "no messages in the record": 1,
                                         "record is list, not an object": 1, "unknown role '…'": 1}
    assert "skipped 4 malformed" in console and "broken JSON line" in console and "wizard" not in console

    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n" + json.dumps({"prompt_id": 3}) + "\n")
    code, console = run_profile(["--traffic", str(bad), "--out", str(tmp_path / "q.json")], capsys)
    errors = [line for line in console.splitlines() if line.startswith("error:")]
    assert code == 1 and not (tmp_path / "q.json").exists() and "Traceback" not in console
    assert len(errors) == 1 and "no readable request" in errors[0] and "2 malformed" in errors[0], console


def test_lengths_are_in_target_tokens_with_a_tokenizer(tmp_path: Path, tiny_target: Path) -> None:
    traffic = tmp_path / "t.jsonl"
    traffic.write_text(json.dumps({"messages": [{"role": "user", "content": "def return import " * 200}]}) + "\n")
    by_chars = build_profile(traffic).model_dump()
    by_tokens = build_profile(traffic, tokenizer=tiny_target).model_dump()
    assert by_chars["length"]["unit"] == "characters" and by_tokens["length"]["unit"] == "tokens"
    assert by_chars["length"]["max"] == len("def return import " * 200)
    assert 200 <= by_tokens["length"]["max"] < by_chars["length"]["max"] / 2
    assert by_tokens["context"]["unit"] == "tokens"
    with pytest.raises(ConfigError, match="not a folder"):
        build_profile(traffic, tokenizer="org/some-model")  # never a Hub download


# ------------------------------------------------------------------ the LLM pass

UNSURE = "Write a Python function that computes the probability that a random integer is prime."
SURE = "Write a poem about the sea."


def _judge(view: View) -> Reply:
    """The stand-in model: reasoning for anything about probability, chat otherwise."""
    category = "reasoning" if "probability" in view.last_user_text else "chat"
    return Reply("", [("set_category", {"category": category})])


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_the_llm_decides_only_the_rows_the_rules_left_unsure(api: str, tmp_path: Path, capsys, monkeypatch) -> None:
    traffic = tmp_path / "t.jsonl"
    rows = [UNSURE + f" Ask {i}: mail me at dev{i}@corp.example" for i in range(3)] + [SURE] * 5
    traffic.write_text("".join(json.dumps({"messages": [{"role": "user", "content": t}]}) + "\n" for t in rows))
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    with ScriptedLLMServer(default_script=_judge) as server:
        url = server.anthropic_url if api == "anthropic" else server.openai_url
        code, console = run_profile(["--traffic", str(traffic), "--out", str(tmp_path / "p.json"), "--llm", api,
                                     "--model", "judge", "--base-url", url], capsys)
        sent = json.dumps(server.bodies)
    assert code == 0, console
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["decided"] == {"rules": 5, "llm": 3, "rules_unsure": 3, "unsure_sent_to_llm": 3}
    assert data["categories"]["reasoning"]["rows"] == 3 and data["categories"]["chat"]["rows"] == 5
    assert data["classifier"]["llm"] == "judge"
    assert len(server.log) == 3 and all(r.status == 200 for r in server.log)
    assert "corp.example" not in sent and "[EMAIL]" in sent  # the model saw the request scrubbed


def test_a_failing_llm_is_one_clear_error_and_no_profile(tmp_path: Path, capsys) -> None:
    traffic = tmp_path / "t.jsonl"
    traffic.write_text(json.dumps({"messages": [{"role": "user", "content": UNSURE}]}) + "\n")
    with ScriptedLLMServer(default_script=_judge, failing={"": 401}) as server:
        code, console = run_profile(["--traffic", str(traffic), "--out", str(tmp_path / "p.json"), "--llm", "openai",
                                     "--model", "judge", "--base-url", server.openai_url], capsys)
    assert code == 1 and not (tmp_path / "p.json").exists()
    assert "refused the key (HTTP 401)" in console and "Traceback" not in console


PERSONAL = {  # what the fault sweep of issue 38 (item 6) found copied, one of each kind
    "address": "Jane Whitfield, 42 Baker Street, London",
    "address_de": "Hauptstraße 17",
    "iban": "DE89 3704 0044 0532 0130 00",
    "iban_packed": "GB82WEST12345698765432",
    "password_words": "my password is Tr0ub4dor",
    "password_short": "pw=abc12",
    "hf_short": "hf_Qm1RtYpLkJhGf",
    "spelled_email": "jane.whitfield at example dot com",
    "named": "My name is Oskar Lindqvist",
    # the fault sweep of 2026-12-04 (item 7)
    "password_contracted": "my password's swordfish123",
    "half_spelled_email": "mail john.pelham at example.com",
    "postcode": "I am John Smith, 221B Baker Street, London NW1 6XE",
    # the fault sweep of issue 49 (item 10)
    "email_accented": "écris à rené.müller@bücher.de",
    "email_fullwidth": "ｍａｉｌ ｊｏｈａｎｎａ＠ｆｉｒｍａ．ｄｅ",
    "email_spaced": "write to wilhelmina @ corp . org",
    "phone_slash": "ruf an 030/98765432",
    "phone_fullwidth": "電話 ０３０－９８７６５４３２",
    "pin": "my PIN 4821",
    "iban_lower": "iban fr76 3000 6000 0112 3456 7890 189",
    "key_b64": "account key QkFzZTY0QWNjb3VudEtleUZvclRlc3Rz",
    "address_number_first": "Odile Marchand, 12 rue de Rivoli, Paris",
}
PERSONAL_NEEDLES = ["Whitfield", "Baker Street", "Hauptstraße 17", "3704 0044", "GB82WEST", "Tr0ub4dor", "abc12",
                    "Qm1RtYpLkJhGf", "example dot com", "Lindqvist", "swordfish123", "pelham", "example.com",
                    "NW1 6XE", "John Smith", "müller", "bücher", "ｊｏｈａｎｎａ", "ｆｉｒｍａ", "wilhelmina",
                    "98765432", "９８７６５４３２", "4821", "3000 6000", "QkFzZTY0", "Rivoli", "Marchand"]


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_addresses_ibans_passwords_and_spelled_out_emails_never_leave_the_traffic(
    api: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    """Profile file, console and the --llm request bodies (issue 38 item 6)."""
    leak = "; ".join(PERSONAL.values())
    rows = [f"{UNSURE} Ask {i}. {v}. {leak}" for i, v in enumerate(PERSONAL.values())] + [f"{SURE} {leak}"] * 3
    traffic = tmp_path / "t.jsonl"
    traffic.write_text("".join(json.dumps({"messages": [{"role": "system", "content": leak},
                                                        {"role": "user", "content": t}]}) + "\n" for t in rows))
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    with ScriptedLLMServer(default_script=_judge) as server:
        url = server.anthropic_url if api == "anthropic" else server.openai_url
        code, console = run_profile(["--traffic", str(traffic), "--out", str(tmp_path / "p.json"), "--llm", api,
                                     "--model", "judge", "--base-url", url], capsys)
        sent = json.dumps(server.bodies, ensure_ascii=False)
    assert code == 0, console
    written = (tmp_path / "p.json").read_text()
    assert sum(len(v) for v in json.loads(written)["examples"].values()) >= 3 and len(server.log) >= 1
    for needle in PERSONAL_NEEDLES:
        for where, text in (("profile", json.loads(written)), ("console", console), ("--llm", sent)):
            assert needle not in json.dumps(text, ensure_ascii=False), (needle, where)
    # --no-examples: no example text in the profile or on the console, the counts the same
    code, console = run_profile(["--traffic", str(traffic), "--out", str(tmp_path / "q.json"), "--no-examples"], capsys)
    assert code == 0 and all(v == [] for v in json.loads((tmp_path / "q.json").read_text())["examples"].values())
    assert "Ask 0" not in console


def test_a_request_log_given_as_a_profile_says_so_and_gives_the_profile_command(tmp_path: Path, capsys) -> None:
    # `--match traffic.jsonl` and `eval --profile traffic.jsonl` used to say "Extra data: line 2 column 1" (issue 46 item 4)
    log = tmp_path / "traffic.jsonl"
    write_jsonl(log, 5, SHARES, seed=3)
    one = tmp_path / "one.jsonl"
    one.write_text(log.read_text().splitlines()[0] + "\n")
    for path in (log, one):
        with pytest.raises(ConfigFileError, match="looks like a request log") as caught:
            load_profile(path)
        assert f"curator profile --traffic {path} --out profile.json" in str(caught.value)
    broken = tmp_path / "broken.json"
    broken.write_text('{"categories": ')
    with pytest.raises(ConfigFileError, match="broken.json is not valid JSON"):
        load_profile(broken)
    # through a command: eval refuses the log before it loads a model
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "p.txt").write_text("hello\n")
    code = main(["eval", "--model", str(model), "--draft", str(model), "--prompts", str(tmp_path / "p.txt"),
                 "--profile", str(log)])
    err = capsys.readouterr().err
    assert code == 1 and "looks like a request log" in err and "curator profile --traffic" in err and "Extra data" not in err


def test_llm_calls_are_bounded_and_a_url_password_is_never_printed(tmp_path: Path, capsys) -> None:
    """Issue 49 items 1 and 2: a server dripping a byte every 50 ms held `profile --llm` for minutes,
    and the error printed --base-url with its password."""
    from tests.fakes.hostile_server import HostileServer, chat_answer
    from tests.fakes.hostile_server import Reply as HostileReply

    traffic = tmp_path / "t.jsonl"
    traffic.write_text(json.dumps({"messages": [{"role": "user", "content": UNSURE}]}) + "\n")
    with HostileServer(lambda request: HostileReply(chat_answer("x" * 400), drip_s=0.05)) as server:
        url = server.url.replace("http://", "http://alice:Pw-9q7Zx@")
        start = time.perf_counter()
        code, console = run_profile(["--traffic", str(traffic), "--out", str(tmp_path / "p.json"), "--llm", "openai",
                                     "--model", "judge", "--base-url", url, "--request-timeout", "1",
                                     "--max-attempts", "1"], capsys)
        took = time.perf_counter() - start
    assert code == 1 and not (tmp_path / "p.json").exists()
    assert took < 10, took  # the drip alone takes 25 s
    assert "no whole answer within 1 s" in console and server.url in console, console
    assert "Pw-9q7Zx" not in console and "alice" not in console
