"""Hub access against a local server speaking the real Hub REST and dataset-viewer APIs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from curator.errors import HubError
from curator.hub import (
    LiveHub,
    SnapshotHub,
    UnknownDatasetError,
    build_snapshot,
    bundled_snapshot_path,
    open_hub,
    size_category_upper_bound,
)
from tests.fakes.hub_server import FakeDataset, FakeHubServer, datasets_from_snapshot

TRAJ = {"_type": "List", "feature": {"role": {"dtype": "string", "_type": "Value"}, "text": {"dtype": "string", "_type": "Value"}}}


def swe_agent() -> FakeDataset:
    return FakeDataset(
        "nebius/SWE-agent-trajectories", downloads=5000, likes=40,
        tags=["license:cc-by-4.0", "size_categories:10K<n<100K", "task_categories:text-generation"],
        card_data={"license": "cc-by-4.0", "task_categories": ["text-generation"]},
        readme="---\nlicense: cc-by-4.0\n---\n# SWE-agent trajectories\nAgent runs on SWE-bench-extra.",
        splits=[("default", "train", 80_036)], features={"instance_id": {"dtype": "string", "_type": "Value"}, "trajectory": TRAJ},
        rows=[{"instance_id": f"repo-{i}", "trajectory": [{"role": "user", "text": "fix it"}]} for i in range(5)],
        num_bytes=5_630_000_000,
    )


def glaive() -> FakeDataset:
    # no README and no viewer: metadata only
    return FakeDataset("glaiveai/glaive-function-calling-v2", downloads=9000, tags=["license:apache-2.0", "size_categories:100K<n<1M"])


@pytest.fixture
def server():
    with FakeHubServer([swe_agent(), glaive()]) as srv:
        yield srv


def live(srv: FakeHubServer, tmp_path: Path, **kw) -> LiveHub:
    return LiveHub(endpoint=srv.url, viewer_url=srv.url, cache_dir=tmp_path / "hf-cache", **kw)


def test_search_returns_most_downloaded_first_with_license_and_size(server, tmp_path):
    async def go():
        hub = live(server, tmp_path)
        try:
            return await hub.search("a", 10)
        finally:
            await hub.aclose()

    hits = asyncio.run(go())
    assert [h.id for h in hits] == ["glaiveai/glaive-function-calling-v2", "nebius/SWE-agent-trajectories"]
    assert hits[1].license == "cc-by-4.0" and hits[1].size_category == "10K<n<100K" and hits[1].downloads == 5000


def test_search_follows_link_pagination(tmp_path):
    many = [FakeDataset(f"org/set-{i:02d}", downloads=100 - i) for i in range(7)]
    with FakeHubServer(many, page_size=3) as srv:
        async def go():
            hub = live(srv, tmp_path)
            try:
                return await hub.search("set", 7)
            finally:
                await hub.aclose()

        hits = asyncio.run(go())
        assert [h.id for h in hits] == [f"org/set-{i:02d}" for i in range(7)]
        assert srv.count("/api/datasets") == 3  # three pages of 3, 3, 1


def test_multi_word_query_falls_back_to_matching_words(server, tmp_path):
    async def go():
        hub = live(server, tmp_path)
        try:
            return await hub.search("swe agent trajectories", 5)
        finally:
            await hub.aclose()

    assert [h.id for h in asyncio.run(go())] == ["nebius/SWE-agent-trajectories"]


def test_inspect_reads_card_splits_rows_and_schema(server, tmp_path):
    async def go():
        hub = live(server, tmp_path)
        try:
            return await hub.inspect("nebius/SWE-agent-trajectories")
        finally:
            await hub.aclose()

    details = asyncio.run(go())
    assert details.license == "cc-by-4.0"
    assert "SWE-bench-extra" in details.card_text and "license:" not in details.card_text  # YAML header stripped
    assert details.num_rows == 80_036 and details.max_rows() == 80_036
    assert details.features == {"instance_id": "string", "trajectory": "list<struct{role: string, text: string}>"}
    assert len(details.example_rows) == 3 and details.preview_split == "train"
    assert details.num_bytes == 5_630_000_000


def test_dataset_without_viewer_or_card_still_inspects(server, tmp_path):
    async def go():
        hub = live(server, tmp_path)
        try:
            return await hub.inspect("glaiveai/glaive-function-calling-v2")
        finally:
            await hub.aclose()

    details = asyncio.run(go())
    assert details.card_text == "" and details.num_rows is None and details.viewer_error
    assert details.max_rows() == 1_000_000  # the size category's upper bound


def test_unknown_dataset_is_an_unknown_dataset_error(server, tmp_path):
    async def go():
        hub = live(server, tmp_path)
        try:
            await hub.inspect("nobody/nothing")
        finally:
            await hub.aclose()

    with pytest.raises(UnknownDatasetError):
        asyncio.run(go())


def test_ten_agents_asking_at_once_cause_one_fetch(server, tmp_path):
    async def go():
        hub = live(server, tmp_path)
        try:
            await asyncio.gather(*(hub.inspect("nebius/SWE-agent-trajectories") for _ in range(10)))
            await asyncio.gather(*(hub.search("swe", 5) for _ in range(10)))
            await hub.inspect("nebius/SWE-agent-trajectories")
            return hub.stats
        finally:
            await hub.aclose()

    stats = asyncio.run(go())
    assert server.count("/api/datasets/nebius/SWE-agent-trajectories") == 1
    assert server.count("/first-rows") == 1 and server.count("/size") == 1
    assert server.count("/api/datasets", "GET") - 1 == 1  # one search request besides the info request
    assert stats.fetches == 2 and stats.cache_hits == 19


def test_viewer_retries_after_429_and_then_succeeds(server, tmp_path):
    server.fail_next("/first-rows", [429, 503])

    async def go():
        hub = live(server, tmp_path)
        try:
            return await hub.inspect("nebius/SWE-agent-trajectories")
        finally:
            await hub.aclose()

    details = asyncio.run(go())
    assert details.example_rows and details.viewer_error is None
    assert server.count("/first-rows") == 3


def test_hf_token_is_sent_to_hub_and_viewer(server, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")

    async def go():
        hub = live(server, tmp_path)
        try:
            await hub.inspect("nebius/SWE-agent-trajectories")
        finally:
            await hub.aclose()

    asyncio.run(go())
    assert server.auth and all(a == "Bearer hf_test_token" for a in server.auth)


def test_token_is_not_sent_where_a_pagination_link_points_to_another_host(tmp_path):
    many = [FakeDataset(f"org/set-{i:02d}", downloads=100 - i) for i in range(4)]
    with FakeHubServer(many, page_size=2) as hub, FakeHubServer(many, page_size=2) as elsewhere:
        hub.link_base = elsewhere.url  # the Hub's `Link: next` names another origin

        async def go():
            client = live(hub, tmp_path, token="hf_secretTokenValue0123456789")
            try:
                return await client.search("set", 4)
            finally:
                await client.aclose()

        hits = asyncio.run(go())
    assert [h.id for h in hits] == [f"org/set-{i:02d}" for i in range(4)]  # the next page was still read
    assert hub.auth and all(a == "Bearer hf_secretTokenValue0123456789" for a in hub.auth)
    assert elsewhere.auth and all(a is None for a in elsewhere.auth)  # ... without the token


def test_env_vars_point_the_client_at_the_server(server, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("CURATOR_VIEWER_URL", server.url)

    async def go():
        hub = LiveHub(cache_dir=tmp_path / "c")
        try:
            return await hub.inspect("nebius/SWE-agent-trajectories")
        finally:
            await hub.aclose()

    assert asyncio.run(go()).num_rows == 80_036


def test_hub_refusal_is_a_hub_error_naming_the_status(server, tmp_path):
    server.fail_next("/api/datasets", [403])

    async def go():
        hub = live(server, tmp_path)
        try:
            await hub.search("swe", 3)
        finally:
            await hub.aclose()

    with pytest.raises(HubError, match="HTTP 403"):
        asyncio.run(go())


def test_unreachable_viewer_still_gives_hub_metadata(server, tmp_path):
    async def go():
        hub = LiveHub(endpoint=server.url, viewer_url="http://127.0.0.1:9", cache_dir=tmp_path, viewer_retries=0)
        try:
            return await hub.inspect("nebius/SWE-agent-trajectories")
        finally:
            await hub.aclose()

    details = asyncio.run(go())
    assert details.license == "cc-by-4.0" and "SWE-bench-extra" in details.card_text
    assert "127.0.0.1:9" in details.viewer_error and details.max_rows() == 100_000


def test_snapshot_round_trip_serves_the_same_answers_offline(server, tmp_path):
    out = tmp_path / "snap.json"

    async def go():
        hub = live(server, tmp_path)
        try:
            summary = await build_snapshot(hub, ["swe", "glaive"], out, per_query=5)
            original = await hub.inspect("nebius/SWE-agent-trajectories")
        finally:
            await hub.aclose()
        offline = SnapshotHub(out)
        return summary, original, offline, await offline.inspect("nebius/SWE-agent-trajectories"), await offline.search("swe", 5)

    summary, original, offline, replayed, hits = asyncio.run(go())
    assert summary.datasets == 2 and summary.queries == 2 and not summary.failed
    assert replayed == original
    assert [h.id for h in hits] == ["nebius/SWE-agent-trajectories"]
    with pytest.raises(UnknownDatasetError):
        asyncio.run(offline.inspect("nobody/nothing"))


def test_missing_or_foreign_snapshot_file_is_a_clear_error(tmp_path):
    with pytest.raises(HubError, match="curator hub snapshot"):
        SnapshotHub(tmp_path / "missing.json")
    (tmp_path / "other.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(HubError, match="not a curator Hub snapshot"):
        SnapshotHub(tmp_path / "other.json")


def _bundled() -> dict:
    return json.loads(bundled_snapshot_path().read_text(encoding="utf-8"))


@pytest.mark.parametrize("shape", ["datasets a list", "datasets nested 100K deep", "searches a list"])
def test_a_snapshot_of_the_wrong_shape_is_a_hub_error(tmp_path, shape):
    """`scout --hub FILE` ended in "unexpected AttributeError/RecursionError" (issue 49 item 8)."""
    data = _bundled()
    if shape == "datasets a list":
        data["datasets"] = list(data["datasets"].items())
        text = json.dumps(data)
    elif shape == "searches a list":
        data["searches"] = [1, 2]
        text = json.dumps(data)
    else:
        text = '{"format": %s, "datasets": %s}' % (json.dumps(data["format"]), "[" * 100_000 + "]" * 100_000)
    path = tmp_path / "snap.json"
    path.write_text(text)
    with pytest.raises(HubError, match=f"Hub snapshot {path}"):
        SnapshotHub(path)


WRONG_TYPES = {"downloads": "many", "tags": 5, "card_text": 7, "num_rows": "x", "likes": 1.5, "gated": 3,
               "splits": [{"config": 1, "split": [], "num_rows": "a"}], "features": [1], "example_rows": "x",
               "license": 3, "size_category": 5, "task_categories": "code", "languages": [1], "last_modified": 5}


@pytest.mark.parametrize("field", WRONG_TYPES)
def test_a_wrongly_typed_snapshot_record_is_skipped_and_counted(tmp_path, field):
    """Such a record reached the agents, whose tools ended in a raw TypeError (issue 49 item 8)."""
    data = _bundled()
    bad = "nebius/SWE-agent-trajectories"
    data["datasets"][bad][field] = WRONG_TYPES[field]
    data["datasets"]["not/an-object"] = ["a", "list"]
    data["searches"]["swe agent"] = 5
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(data))
    hub = SnapshotHub(path)
    assert bad not in hub.datasets and "not/an-object" not in hub.datasets and hub.skipped == 3
    assert len(hub.datasets) == len(data["datasets"]) - 2
    hits = asyncio.run(hub.search("swe agent trajectories", 20))  # matched locally: the others still serve
    assert bad not in [h.id for h in hits]
    for details in hub.datasets.values():  # what the agents' tools read of every record still works
        asyncio.run(hub.inspect(details.id)).catalog_record()
    for record in data["datasets"].values():
        if isinstance(record, dict):
            record[field] = WRONG_TYPES[field]
    path.write_text(json.dumps(data))
    with pytest.raises(HubError, match=f"none of its .* dataset records parses .*{field}"):
        SnapshotHub(path)


def test_bundled_snapshot_holds_real_ids_small_and_labelled():
    path = bundled_snapshot_path()
    assert path.stat().st_size < 300_000
    hub = open_hub("bundled")
    assert "illustrative" in hub.meta["note"]
    swe = asyncio.run(hub.inspect("nebius/SWE-agent-trajectories"))
    assert swe.num_rows == 80_036 and swe.license == "cc-by-4.0"
    assert "trajectory" in swe.features
    infinity = asyncio.run(hub.inspect("BAAI/Infinity-Instruct"))
    assert infinity.gated == "manual"
    assert all("illustrative" in d.card_text for d in hub.datasets.values())


def test_bundled_snapshot_served_by_the_fake_hub_reads_back_identically(tmp_path):
    with FakeHubServer(datasets_from_snapshot(bundled_snapshot_path())) as srv:
        async def go():
            hub = live(srv, tmp_path)
            try:
                return await hub.inspect("open-r1/Mixture-of-Thoughts")
            finally:
                await hub.aclose()

        details = asyncio.run(go())
    offline = asyncio.run(open_hub("bundled").inspect("open-r1/Mixture-of-Thoughts"))
    assert details.num_rows == offline.num_rows == 349_317
    assert details.features == offline.features
    assert [(s.config, s.split, s.num_rows) for s in details.splits] == [(s.config, s.split, s.num_rows) for s in offline.splits]


def test_size_category_bounds():
    assert size_category_upper_bound("10K<n<100K") == 100_000
    assert size_category_upper_bound("size_categories:1M<n<10M") == 10_000_000
    assert size_category_upper_bound("n>1T") is None and size_category_upper_bound(None) is None
