"""A synthetic, deterministic multi-step tool task (a trip planner), for the memory bank's
example (``examples/memory_bank_agent.py``), its measure (``python -m bench.tool_records``)
and its tests.

The model's side is scripted (``script``: which tools it calls at each step, every fifth
step two calls in parallel); the tools' side (``tool_output``) answers JSON of a realistic
size full of identifiers, the same for the same call. ``run_agent`` is the ordinary agent
loop of an ``openai`` client: call the model, run the tools it asks for, append their
answers, until it answers text.
"""

import hashlib
import json
import random

TASK = (
    "Plan a two-week rail trip through Europe: for each city find a hotel under 150 EUR a "
    "night with good reviews, check that it has rooms for three nights, look at the weather, "
    "and find the train to the next city. Finish with the full itinerary and every booking "
    "reference."
)
SYSTEM = "You are a travel agent. Use the tools; keep the ids they return."
CITIES = ["Lisbon", "Madrid", "Barcelona", "Lyon", "Paris", "Brussels", "Amsterdam", "Berlin"]
FINAL_ANSWER = "Here is the itinerary with every booking reference."


def _function(name: str, description: str, **parameters) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": t} for p, t in parameters.items()},
                "required": list(parameters),
            },
        },
    }


TOOLS = [
    _function("search_hotels", "Hotels in a city", city="string"),
    _function("get_hotel_details", "One hotel's details and reviews", hotel_id="string"),
    _function(
        "check_availability", "Rooms free for some nights", hotel_id="string", nights="integer"
    ),
    _function("get_weather", "The forecast for a city", city="string"),
    _function("search_trains", "Trains between two cities", origin="string", destination="string"),
]


def _rng(name: str, arguments: dict) -> random.Random:
    key = json.dumps([name, arguments], sort_keys=True).encode()
    return random.Random(hashlib.sha256(key).hexdigest())


def _hotel_id(city: str, n: int) -> str:
    return f"htl-{city[:3].lower()}-{n:03d}"


def tool_output(name: str, arguments: dict):
    """The tool's answer: deterministic JSON, 1-3 KB, with ids, prices and codes."""
    rng = _rng(name, arguments)
    if name == "search_hotels":
        city = arguments["city"]
        return {
            "city": city,
            "results": [
                {
                    "id": _hotel_id(city, n),
                    "name": f"{rng.choice(['Grand', 'Old Town', 'Harbour', 'Park', 'Central'])} "
                    f"{rng.choice(['Hotel', 'Inn', 'Rooms', 'Suites'])} {city}",
                    "price_eur": rng.randint(70, 260),
                    "rating": round(rng.uniform(6.5, 9.8), 1),
                    "address": f"{rng.randint(1, 200)} {rng.choice(['Main', 'River', 'Station'])} St",
                }
                for n in range(1, 21)
            ],
            "page": {"number": 1, "total_results": rng.randint(40, 300)},
        }
    if name == "get_hotel_details":
        return {
            "id": arguments["hotel_id"],
            "amenities": rng.sample(
                ["wifi", "breakfast", "gym", "spa", "bar", "parking", "pool", "laundry"], 5
            ),
            "reviews": [
                {
                    "review_id": f"rev-{rng.randint(10000, 99999)}",
                    "score": rng.randint(5, 10),
                    "text": rng.choice(
                        [
                            "Clean rooms and friendly staff, close to the station.",
                            "Noisy at night but the breakfast was excellent.",
                            "Great location, small rooms, would stay again.",
                        ]
                    ),
                }
                for _ in range(10)
            ],
            "check_in": "15:00",
            "check_out": "11:00",
        }
    if name == "check_availability":
        return {
            "hotel_id": arguments["hotel_id"],
            "nights": arguments["nights"],
            "available": True,
            "rooms": [
                {
                    "room_code": f"R{rng.randint(100, 999)}",
                    "type": t,
                    "total_eur": rng.randint(200, 600),
                }
                for t in ("single", "double", "twin", "suite")
            ],
            "hold_reference": f"HOLD-{rng.randint(100000, 999999)}",
        }
    if name == "get_weather":
        return {
            "city": arguments["city"],
            "days": [
                {
                    "date": f"2026-06-{day:02d}",
                    "high_c": rng.randint(17, 33),
                    "rain_mm": rng.randint(0, 12),
                }
                for day in range(1, 15)
            ],
        }
    if name == "search_trains":
        return {
            "origin": arguments["origin"],
            "destination": arguments["destination"],
            "trains": [
                {
                    "train_id": f"{rng.choice(['TGV', 'ICE', 'AVE', 'EST'])}-{rng.randint(1000, 9999)}",
                    "departs": f"{rng.randint(6, 20):02d}:{rng.choice(['05', '20', '45'])}",
                    "duration_min": rng.randint(90, 420),
                    "fare_eur": rng.randint(29, 180),
                }
                for _ in range(5)
            ],
        }
    return {"error": f"unknown tool {name}"}


def script(steps: int) -> list[list[tuple[str, dict]]]:
    """The model's tool calls for ``steps`` steps: (tool, arguments) per call, cycling
    through the cities; every fifth step calls two tools in parallel."""
    plan = []
    for step in range(steps):
        city = CITIES[(step // 5) % len(CITIES)]
        following = CITIES[(step // 5 + 1) % len(CITIES)]
        hotel = _hotel_id(city, step % 7 + 1)
        calls = [
            [("search_hotels", {"city": city})],
            [("get_hotel_details", {"hotel_id": hotel})],
            [("check_availability", {"hotel_id": hotel, "nights": 3})],
            [("get_weather", {"city": city})],
            [
                ("search_trains", {"origin": city, "destination": following}),
                ("get_weather", {"city": following}),
            ],
        ][step % 5]
        plan.append(calls)
    return plan


def _after(message) -> list[dict]:
    """What the loop appends after the model's message: the message, and one tool answer
    per call it made."""
    appended = [message.model_dump(exclude_none=True)]
    for call in message.tool_calls:
        output = tool_output(call.function.name, json.loads(call.function.arguments or "{}"))
        appended.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(output)})
    return appended


def first_messages(task: str = TASK) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]


def run_agent(client, *, model: str, task: str = TASK, max_steps: int = 100) -> list[dict]:
    """The agent loop; the whole history at the end."""
    messages = first_messages(task)
    for _ in range(max_steps):
        response = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        message = response.choices[0].message
        if not message.tool_calls:
            messages.append({"role": "assistant", "content": message.content})
            break
        messages += _after(message)
    return messages


async def arun_agent(client, *, model: str, task: str = TASK, max_steps: int = 100) -> list[dict]:
    """``run_agent`` with an ``AsyncOpenAI`` client."""
    messages = first_messages(task)
    for _ in range(max_steps):
        response = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        message = response.choices[0].message
        if not message.tool_calls:
            messages.append({"role": "assistant", "content": message.content})
            break
        messages += _after(message)
    return messages


def context_tokens(
    llm, tool_call, *, steps: int, server_url: str, agent: str, api_key: str | None = None
) -> list[dict]:
    """Run the task twice against the stand-in LLM ``llm`` (``tests.fake_openai.FakeOpenAI``,
    whose ``ToolCall`` is ``tool_call``): sending the whole history, then inside
    ``learning(strategy="memory_bank")`` (with ``api_key``, the agent's key, when it has
    one). Per step, the estimated tokens (characters / 4 of the messages' JSON,
    ``memory_bank.estimated_tokens``) the model received either way."""
    import openai

    from memsvc.client import learning
    from memsvc.memory_bank import estimated_tokens

    client = openai.OpenAI(base_url=llm.base_url, api_key="test")
    plan = [[tool_call(name, arguments) for name, arguments in calls] for calls in script(steps)]
    received = {}
    for strategy in ("whole history", "memory bank"):
        llm.then(*plan, FINAL_ANSWER)
        first = len(llm.requests)
        if strategy == "memory bank":
            with learning(
                agent=agent, server_url=server_url, api_key=api_key, strategy="memory_bank"
            ):
                run_agent(client, model="gpt-test")
        else:
            run_agent(client, model="gpt-test")
        received[strategy] = [
            estimated_tokens(request.body["messages"])
            for request in llm.requests[first:]
            if request.path.endswith("/chat/completions")
        ]
    return [
        {"step": step, "whole_history": whole, "memory_bank": bank}
        for step, (whole, bank) in enumerate(
            zip(received["whole history"], received["memory bank"], strict=True), start=1
        )
    ]
