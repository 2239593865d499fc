"""The memory bank's observer: the deterministic summary every record gets at once, and the
LLM's (a stand-in OpenAI-compatible server, tests/fake_openai.py, that the real ``openai``
package talks to) once the record is committed."""

import json

import numpy as np
import pytest

from agents_api.models import SummarySource, ToolRecord
from agents_api.observer import (
    OBSERVER_INPUT_CHARS,
    fallback_summary,
    identifiers,
    observer_messages,
)
from search.embeddings import configured_backend
from tests.agents_api.test_tool_records import HOTELS, RECORDS, create
from tests.fake_openai import FakeOpenAI
from tests.local_http import Reply

pytestmark = pytest.mark.django_db

MARKER = "You are the observer"  # the observer prompt's first words
LLM_SUMMARY = "Found 3 hotels in Lisbon: htl-001 Grand Hotel (120), htl-002, htl-003."


@pytest.fixture
def llm(settings):
    with FakeOpenAI(reply="unused") as fake:
        settings.MEMSVC_LLM_BASE_URL = fake.base_url
        settings.MEMSVC_LLM_MODEL = "gpt-test"
        fake.answer(MARKER, LLM_SUMMARY)
        yield fake


def create_committed(api, credential, capture, **kwargs) -> ToolRecord:
    """A record created by a request whose transaction commits (the observer runs then)."""
    with capture(execute=True):
        record = create(api, credential, **kwargs)
    return ToolRecord.objects.get(id=record["traceId"])


def test_the_llm_summary_replaces_the_fallback_and_is_embedded(
    api, helper, llm, django_capture_on_commit_callbacks
):
    record = create_committed(api, helper, django_capture_on_commit_callbacks, input={"q": "x"})
    [request] = llm.requests_containing(MARKER)
    assert request["model"] == "gpt-test"
    prompt = request["messages"][1]["content"]
    assert "Tool: search_hotels" in prompt and '"htl-002"' in prompt and '"q": "x"' in prompt
    assert (record.summary, record.summary_source) == (LLM_SUMMARY, SummarySource.LLM)
    [expected] = configured_backend().embed([LLM_SUMMARY])
    assert np.dot(record.embedding, expected) > 0.999
    assert api.get(f"{RECORDS}/{record.id}", as_=helper).json()["summary"] == LLM_SUMMARY


def test_the_output_sent_to_the_llm_is_cut_at_10000_characters(
    api, helper, llm, django_capture_on_commit_callbacks
):
    big = {"rows": [{"id": f"row-{i:05d}", "text": "lorem ipsum " * 5} for i in range(400)]}
    assert len(json.dumps(big)) > 2 * OBSERVER_INPUT_CHARS
    record = create_committed(api, helper, django_capture_on_commit_callbacks, output=big)
    [request] = llm.requests_containing(MARKER)
    prompt = request["messages"][1]["content"]
    assert "[... output truncated]" in prompt
    assert len(prompt) < OBSERVER_INPUT_CHARS + 200
    assert record.raw_output == big  # the fact store keeps it whole


@pytest.mark.parametrize(
    "answer",
    [
        "   ",  # nothing but whitespace
        Reply(status=400, payload={"error": {"message": "context length exceeded"}}),
        # A server that is no OpenAI-compatible one (a web page at that URL), or answers
        # another shape: the task failed on these (a review's finding).
        Reply(payload=b"<html>It works!</html>", headers={"Content-Type": "text/html"}),
        Reply(payload={"choices": [{"message": None}]}),
        Reply(payload={"choices": [{"message": {"role": "assistant", "content": ["x"]}}]}),
    ],
)
def test_an_empty_or_failed_answer_keeps_the_fallback(
    api, helper, llm, django_capture_on_commit_callbacks, answer
):
    llm.answer(MARKER, answer)
    record = create_committed(api, helper, django_capture_on_commit_callbacks)
    assert len(llm.requests_containing(MARKER)) == 1
    assert record.summary_source == SummarySource.FALLBACK
    assert record.summary == fallback_summary("search_hotels", {}, HOTELS)
    assert record.embedding is not None


def test_a_summary_is_stored_without_what_postgresql_cannot_hold(
    api, helper, llm, django_capture_on_commit_callbacks
):
    """A NUL and a lone surrogate in the model's answer: the task failed on them (a review's
    finding), and the record kept only its fallback."""
    llm.answer(MARKER, "Found htl-001\x00 in Lisbon \ud800.")
    record = create_committed(api, helper, django_capture_on_commit_callbacks)
    assert (record.summary, record.summary_source) == (
        "Found htl-001 in Lisbon ?.",
        SummarySource.LLM,
    )


def test_a_callers_summary_is_not_sent_to_the_llm(
    api, helper, llm, django_capture_on_commit_callbacks
):
    record = create_committed(
        api, helper, django_capture_on_commit_callbacks, summary="Three hotels."
    )
    assert llm.requests_containing(MARKER) == []
    assert (record.summary, record.summary_source) == ("Three hotels.", SummarySource.CALLER)


def test_without_an_llm_nothing_is_asked(api, helper, django_capture_on_commit_callbacks):
    with FakeOpenAI() as fake:  # running, but not configured
        record = create_committed(api, helper, django_capture_on_commit_callbacks)
        assert fake.requests == []
    assert record.summary_source == SummarySource.FALLBACK


def test_parallel_calls_get_one_observer_call_each(
    api, llm, django_capture_on_commit_callbacks, settings
):
    settings.LOCAL_MODE = True
    assert api.post("/agents", {"name": "planner"}).status_code == 200
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(
            "/tool-records",
            {
                "agent_name": "planner",
                "task_id": "trip",
                "records": [
                    {"step": 2, "tool_name": "search_hotels", "output": HOTELS},
                    {"step": 2, "tool_name": "get_weather", "output": {"forecast": "sun"}},
                ],
            },
        )
    assert response.status_code == 200, response.content
    assert [r["tool_name"] for r in response.json()] == ["search_hotels", "get_weather"]
    assert len(llm.requests_containing(MARKER)) == 2
    assert set(ToolRecord.objects.values_list("summary_source", flat=True)) == {"llm"}


# --- the deterministic summary (no database needed) ------------------------------------------


def test_identifiers_are_id_like_keys_and_id_like_values_each_once():
    output = {
        "booking": {"bookingRef": "ZX81", "hotel_id": 4417, "status": "confirmed"},
        "rooms": [{"code": "DBL"}, {"code": "DBL"}],
        "note": "check-in after 2pm",
        "when": "2026-05-01",
        "flag": True,
    }
    assert identifiers(output) == ["ZX81", "4417", "DBL", "2026-05-01"]


def test_the_fallback_names_the_tool_input_sizes_identifiers_and_errors():
    summary = fallback_summary("search_hotels", {"city": "Lisbon"}, HOTELS)
    assert summary == (
        "Tool search_hotels returned an object with 1 field (results). "
        'Input: {"city": "Lisbon"}. Sizes: results: 3 items. '
        "Identifiers: htl-001, htl-002, htl-003."
    )
    failed = fallback_summary("book", {}, {"error": "no rooms left", "code": 409})
    assert "Error: no rooms left." in failed and "409" in failed
    assert fallback_summary("read_page", {}, {"_raw": "<html>"}) == (
        "Tool read_page returned text of 6 characters. Text: <html>."
    )
    # A text answer says what it says (each said only its length: an error in one was found
    # by nothing of it; review), cut as an input is.
    refused = fallback_summary("fetch", {}, {"_raw": "Error: connection refused to ERRHOST-9"})
    assert refused.endswith("Text: Error: connection refused to ERRHOST-9.")
    long = fallback_summary("read_page", {}, {"_raw": "x" * 5_000})
    assert len(long) < 400 and "Text: xxx" in long
    assert fallback_summary("noop", {}, None) == "Tool noop returned nothing."
    # A JSON string is text too, its letters as they are (they were escaped, "\u6771...",
    # and its vector and keywords read those: review).
    assert fallback_summary("jp", {}, "東京駅の天気は晴れです") == (
        "Tool jp returned text of 11 characters. Text: 東京駅の天気は晴れです."
    )
    assert fallback_summary("price", {}, "€5") == (
        "Tool price returned text of 2 characters. Text: €5."
    )
    assert fallback_summary("blank", {}, "   ") == "Tool blank returned text of 3 characters."


def test_the_observer_prompt_keeps_the_seeds_rules():
    system, user = observer_messages("t", {}, {"a": 1})
    for rule in ("achieved", "identifier", "under 200 words"):
        assert rule in system["content"]
    assert user["content"].endswith('{"a": 1}')
