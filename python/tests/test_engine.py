"""keel.Engine over a generated model: two turns with a tool call, streaming,
cancel from another thread, compaction switched between turns, errors,
the context manager."""
import json
import os
import threading
import time

import pytest

from conftest import TOOLS

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Use the tools when they help."}
USER = {"role": "user", "content": "What is the weather like in Paris today?"}


def check_weather_call(call):
    assert call.name == "get_weather"
    assert call.id
    args = call.args()  # the strict schema's grammar: always valid JSON
    assert isinstance(args, dict) and set(args) <= {"city", "unit"}
    assert isinstance(args["city"], str) and len(args["city"]) <= 12


def test_two_turns_with_a_tool_call(keel_mod, engine):
    keel = keel_mod
    messages = [SYSTEM, USER]
    # turn 1, streamed: a random model makes a call only when forced (tool_choice
    # "required" opens the hermes call; strict: true constrains its arguments; one call: it always ends)
    events = list(engine.stream(messages, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                                temperature=1, seed=3,
                                max_tokens=300))
    assert isinstance(events[0], keel.PromptEvent) and events[0].cached_tokens == 0
    assert isinstance(events[-1], keel.Done)
    r1 = events[-1].completion
    assert r1.finish_reason == "tool_calls", r1
    assert len(r1.tool_calls) == 1
    for c in r1.tool_calls:
        check_weather_call(c)
    # the streamed calls are the response's calls
    streamed = [e.call for e in events if isinstance(e, keel.ToolCallEvent)]
    assert [(c.id, c.name, c.arguments) for c in streamed] == [(c.id, c.name, c.arguments) for c in r1.tool_calls]
    assert all(c.error is None for c in streamed)
    starts = [e for e in events if isinstance(e, keel.ToolCallStart)]
    assert [(s.index, s.id, s.name) for s in starts] == [(c.index, c.id, c.name) for c in r1.tool_calls]
    deltas = "".join(e.arguments for e in events if isinstance(e, keel.ToolCallDelta) and e.index == 0)
    assert deltas == r1.tool_calls[0].arguments
    assert r1.usage.prompt_tokens == events[0].prompt_tokens > 0
    assert 0 < r1.usage.completion_tokens <= 300
    assert r1.raw["tool_grammar"].startswith("forced")

    # turn 2: the assistant's call and the tool's result; the cache is reused
    messages += [r1.message()]
    messages += [keel.tool_message(c, {"city": c.args()["city"], "temperature": 18, "sky": "rain"})
                 for c in r1.tool_calls]
    assert messages[2]["tool_calls"][0]["function"]["name"] == "get_weather"
    seen = []
    r2 = engine.complete(messages, tools=TOOLS, temperature=0, max_tokens=24, on_event=seen.append)
    assert r2.finish_reason in ("stop", "length", "tool_calls")
    assert 0 < r2.usage.completion_tokens <= 24
    assert r2.usage.prompt_tokens > r1.usage.prompt_tokens
    assert r2.usage.cached_tokens > 0, r2.usage
    assert r2.memory.cache == "reused"
    assert isinstance(seen[0], keel.PromptEvent) and seen[0].cached_tokens == r2.usage.cached_tokens
    assert isinstance(seen[-1], keel.Done) and seen[-1].completion == r2
    assert "".join(e.text for e in seen if isinstance(e, keel.TextDelta)) == r2.text
    assert "".join(e.text for e in seen if isinstance(e, keel.ReasoningDelta)) == r2.reasoning
    assert r2.timings.predicted_ms > 0
    st = engine.stats()
    assert st["requests"] == 2 and st["slots"][0]["cached_tokens"] > 0
    engine.reset()
    st = engine.stats()
    assert st["slots"][0]["cached_tokens"] == 0


def test_stream_equals_complete(keel_mod, engine):
    msgs = [USER]
    r = engine.complete(msgs, temperature=0, max_tokens=16)
    engine.reset()
    s = engine.stream(msgs, temperature=0, max_tokens=16)
    text = s.text()
    assert text == r.text
    assert s.completion.text == r.text and s.completion.usage.completion_tokens == r.usage.completion_tokens
    assert list(s) == []  # exhausted


def _canceller(engine, first_piece, cancelled):
    first_piece.wait(30)
    engine.cancel()
    cancelled.append(time.monotonic())


def test_cancel_from_a_thread(keel_mod, keel_bin, tmp_path):
    from conftest import gen_model
    keel = keel_mod
    # a wider model so that the turn would run for a while
    path = gen_model(keel_bin, tmp_path / "wide.gguf", "--embd", "256", "--layers", "4", "--heads", "8",
                     "--kv-heads", "4")
    with keel.Engine(path, chat_template="qwen3", n_ctx=8192, n_threads=2) as e:
        first_piece, cancelled = threading.Event(), []
        th = threading.Thread(target=_canceller, args=(e, first_piece, cancelled))
        th.start()

        def on_event(ev):
            if isinstance(ev, keel.TextDelta) and not first_piece.is_set():
                first_piece.set()
                th.join(30)  # the cancel surely lands before the turn could end by itself
            return True

        r = e.complete([USER], temperature=0.8, max_tokens=6000, ignore_eos=True, on_event=on_event)
        returned = time.monotonic()
        th.join()
        assert r.finish_reason == "cancelled" and r.cancelled
        assert 0 < r.usage.completion_tokens < 100, r.usage
        assert returned - cancelled[0] < 2.0, f"complete() returned {returned - cancelled[0]:.2f} s after cancel()"
        # the engine still works after a cancel, and a new turn is not cancelled
        r2 = e.complete([USER], max_tokens=4, temperature=0)
        assert r2.finish_reason in ("stop", "length")

        # a stream cancelled by another thread after its first piece
        s = e.stream([USER], temperature=0.8, max_tokens=6000, ignore_eos=True)
        t0 = None
        n_text = 0
        for ev in s:
            if isinstance(ev, keel.TextDelta):
                n_text += 1
                if t0 is None:
                    t0 = time.monotonic()
                    threading.Thread(target=e.cancel).start()
        assert t0 is not None and n_text >= 1
        assert s.completion.finish_reason == "cancelled"
        assert s.completion.usage.completion_tokens < 6000
        assert time.monotonic() - t0 < 5.0


def test_leaving_a_stream_early_cancels_it(keel_mod, engine):
    keel = keel_mod
    s = engine.stream([USER], temperature=0.8, max_tokens=3000, ignore_eos=True)
    for ev in s:
        if isinstance(ev, keel.TextDelta):
            break
    s.close()
    r = engine.complete([USER], max_tokens=2, temperature=0)  # the engine is free again
    assert r.usage.completion_tokens > 0
    assert engine.stats()["slots"][0]["cells"] < 3000


def test_compaction_off_and_on_between_turns(keel_mod, engine):
    keel = keel_mod
    on = {"policy": "keydiff", "trigger": 128, "target": 64}
    messages = [SYSTEM, USER]
    # the tools make the prompt longer than the trigger
    r1 = engine.complete(messages, tools=TOOLS, max_tokens=40, temperature=0, kv_compact=on)
    assert r1.usage.prompt_tokens > 128
    assert r1.memory.compactions > 0, r1.memory
    assert r1.memory.cells <= 128
    messages += [{"role": "assistant", "content": r1.text}, {"role": "user", "content": "And tomorrow?"}]
    r2 = engine.complete(messages, tools=TOOLS, max_tokens=40, temperature=0, kv_compact="none")
    assert r2.memory.compactions == 0, r2.memory
    assert r2.memory.cells >= r2.usage.prompt_tokens
    messages += [{"role": "assistant", "content": r2.text}, {"role": "user", "content": "And in Rome?"}]
    r3 = engine.complete(messages, tools=TOOLS, max_tokens=40, temperature=0, kv_compact=on)
    assert r3.memory.compactions > 0, r3.memory
    assert r3.memory.cells <= 128
    # the engine-wide default: compaction from open, switched off by a request
    with keel.Engine(engine.model, chat_template="qwen3", n_ctx=4096, n_threads=2, kv_compact=on) as e:
        a = e.complete([SYSTEM, USER], tools=TOOLS, max_tokens=20, temperature=0)
        assert a.memory.compactions > 0
        b = e.complete([SYSTEM, USER], tools=TOOLS, max_tokens=20, temperature=0, kv_compact="none")
        assert b.memory.compactions == 0


def test_bad_model_path(keel_mod, tmp_path):
    keel = keel_mod
    missing = str(tmp_path / "no-such-model.gguf")
    with pytest.raises(keel.KeelIOError) as ei:
        keel.Engine(missing)
    e = ei.value
    assert isinstance(e, keel.KeelError) and isinstance(e, OSError)
    assert e.status == 6 and e.status_name == "KEEL_EIO"
    assert missing in e.message and "No such file" in e.message
    assert "KEEL_EIO" in str(e) and missing in str(e)
    # not a model: a clear format error
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a gguf file" * 10)
    with pytest.raises(keel.KeelError) as ei:
        keel.Engine(str(junk))
    assert ei.value.status == 5 and ei.value.status_name == "KEEL_EFORMAT" and ei.value.message


def test_bad_options(keel_mod, engine, model):
    keel = keel_mod
    with pytest.raises(keel.InvalidArgumentError) as ei:
        keel.Engine(model, n_ctxx=10)
    assert ei.value.status == 1 and "n_ctxx" in ei.value.message and isinstance(ei.value, ValueError)
    with pytest.raises(keel.InvalidArgumentError) as ei:
        engine.complete([USER], max_tokenz=3)
    assert "max_tokenz" in ei.value.message and ei.value.func == "keel_complete"
    # the engine is still usable
    assert engine.complete([USER], max_tokens=2, temperature=0).usage.completion_tokens > 0


def test_context_manager(keel_mod, model):
    keel = keel_mod
    with keel.Engine(model, n_threads=1) as e:
        assert not e.closed
        assert e.complete("Hi", max_tokens=2).usage.completion_tokens > 0
    assert e.closed
    with pytest.raises(keel.StateError):
        e.complete("Hi", max_tokens=2)
    with pytest.raises(keel.StateError):
        e.stats()
    e.close()  # idempotent
    with pytest.raises(RuntimeError):
        with keel.Engine(model, n_threads=1) as e2:
            raise RuntimeError("leaves the block")
    assert e2.closed


def test_one_turn_at_a_time_and_close_from_another_thread(keel_mod, engine, model):
    keel = keel_mod
    started = threading.Event()
    release = threading.Event()
    errors = []

    def second_turn():
        started.wait(30)
        try:
            engine.complete("x", max_tokens=1)
        except keel.StateError as ex:
            errors.append(ex)
        release.set()

    th = threading.Thread(target=second_turn)
    th.start()

    def on_event(ev):
        started.set()
        release.wait(30)
        # close() from inside the turn is refused (it would wait for itself)
        with pytest.raises(keel.StateError):
            engine.close()
        return True

    engine.complete("Hi", max_tokens=2, on_event=on_event)
    th.join()
    assert len(errors) == 1 and "another complete()" in errors[0].message

    # close() from another thread while a stream runs: cancels and waits
    e = keel.Engine(model, n_threads=1, n_ctx=4096)
    s = e.stream([USER], max_tokens=3000, ignore_eos=True, temperature=1)
    next(s)
    closer = threading.Thread(target=e.close)
    closer.start()
    closer.join(30)
    assert not closer.is_alive() and e.closed
    events = list(s)
    assert isinstance(events[-1], keel.Done) and events[-1].finish_reason == "cancelled"


def test_save_restore(keel_mod, model, tmp_path):
    keel = keel_mod
    path = str(tmp_path / "slot.bin")
    with keel.Engine(model, chat_template="qwen3", n_ctx=2048, n_threads=1) as e:
        r1 = e.complete([USER], max_tokens=8, temperature=0)
        info = e.save(path)
        assert info["n_saved"] > 0 and os.path.getsize(path) > 0
    with keel.Engine(model, chat_template="qwen3", n_ctx=2048, n_threads=1) as e:
        assert e.restore(path)["n_restored"] == info["n_saved"]
        r2 = e.complete([USER, {"role": "assistant", "content": r1.text}, {"role": "user", "content": "More"}],
                        max_tokens=4, temperature=0)
        assert r2.usage.cached_tokens > 0
        with pytest.raises(keel.KeelError) as ei:
            e.restore(str(tmp_path / "missing.bin"))
        assert ei.value.status in (6, 8) and "missing.bin" in ei.value.message


def test_count_tokens_and_json_values(keel_mod, engine):
    n = engine.count_tokens([SYSTEM, USER], tools=TOOLS)
    r = engine.complete([SYSTEM, USER], tools=TOOLS, max_tokens=1, temperature=0)
    assert n == r.usage.prompt_tokens
    assert json.loads(json.dumps(r.raw)) == r.raw


def test_logprob_events(keel_mod, engine):
    """The last fields of keel_event (token, logprob) are where the mirror says."""
    keel = keel_mod
    events = list(engine.stream([USER], max_tokens=6, temperature=0, logprobs=True, top_logprobs=2))
    lp = [e for e in events if isinstance(e, keel.LogprobEvent)]
    content = events[-1].completion.raw["logprobs"]["content"]
    assert len(lp) == len(content) == events[-1].completion.usage.completion_tokens
    for e, c in zip(lp, content):
        assert e.entry == c
        assert e.logprob == pytest.approx(c["logprob"], abs=1e-4) and e.logprob <= 0
        assert e.token >= 0


def test_exception_in_on_event_cancels_the_turn(keel_mod, engine):
    keel = keel_mod
    n = []

    def on_event(ev):
        if isinstance(ev, keel.TextDelta):
            n.append(ev)
            raise KeyboardInterrupt  # as Ctrl-C would, raised in the callback
        return True

    with pytest.raises(KeyboardInterrupt):
        engine.complete([USER], max_tokens=3000, ignore_eos=True, temperature=1, on_event=on_event)
    assert len(n) == 1
    st = engine.stats()
    assert st["slots"][0]["state"] == "idle" and st["slots"][0]["cells"] < 3000
    # a False return stops too, without an exception
    r = engine.complete([USER], max_tokens=3000, ignore_eos=True, temperature=1,
                        on_event=lambda ev: not isinstance(ev, keel.TextDelta))
    assert r.finish_reason == "cancelled" and r.usage.completion_tokens < 3000


def test_prompt_too_long_carries_the_response(keel_mod, model):
    keel = keel_mod
    with keel.Engine(model, n_ctx=256, n_threads=1) as e:
        with pytest.raises(keel.ContextError) as ei:
            e.complete("word " * 2000, max_tokens=4)
        x = ei.value
        assert x.status == 13 and x.status_name == "KEEL_ECONTEXT" and "tokens" in x.message
        assert x.response is not None and x.response.usage.prompt_tokens > 256
        assert x.response.raw["prompt_limit"] == 256
        assert e.complete("hi", max_tokens=2).usage.completion_tokens > 0
