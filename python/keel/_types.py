"""The typed results and events of keel.Engine (the response JSON of
keel_complete and its keel_event stream, include/keel.h)."""

import json
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model made: arguments is the JSON text it wrote
    (call .args() for the parsed object)."""
    id: str
    name: str
    arguments: str
    index: int = 0
    error: Optional[str] = None  # streamed calls: why the call is malformed (arguments then raw text)

    def args(self) -> Any:
        """The arguments, parsed (json.JSONDecodeError when the model wrote malformed JSON)."""
        return json.loads(self.arguments) if self.arguments else {}

    def to_dict(self) -> Dict[str, Any]:
        """The OpenAI shape, as an assistant message's tool_calls entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, reused from the cache (not prefilled)
    completion_tokens: int = 0


@dataclass(frozen=True)
class Timings:
    prompt_ms: float = 0.0
    predicted_ms: float = 0.0
    prompt_per_second: float = 0.0
    predicted_per_second: float = 0.0


@dataclass(frozen=True)
class Memory:
    cells: int = 0        # cache cells the slot holds after the turn
    compactions: int = 0  # compactions during this turn
    cache: str = ""       # "reused", or "reset: why"


def _num(d, key, kind):
    v = d.get(key) if isinstance(d, dict) else None
    try:
        return kind(v) if v is not None else kind()
    except (TypeError, ValueError):
        return kind()


@dataclass(frozen=True)
class Completion:
    """One turn's result. raw is the whole response JSON (a dict), for the
    fields this class does not name (logprobs, tool_grammar, ...)."""
    text: str
    reasoning: str
    tool_calls: Tuple[ToolCall, ...]
    finish_reason: str  # "stop", "length", "tool_calls" or "cancelled"
    usage: Usage
    timings: Timings
    memory: Memory
    stop_sequence: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def cancelled(self) -> bool:
        return self.finish_reason == "cancelled"

    def message(self) -> Dict[str, Any]:
        """The assistant message to append to the conversation for the next turn."""
        m: Dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.reasoning:
            m["reasoning_content"] = self.reasoning
        if self.tool_calls:
            m["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        return m

    @classmethod
    def from_json(cls, text: str) -> "Completion":
        r = json.loads(text)
        if not isinstance(r, dict):
            raise ValueError("the response is not a JSON object")
        calls = []
        for i, c in enumerate(r.get("tool_calls") or []):
            fn = c.get("function") or {}
            args = fn.get("arguments", "")
            if not isinstance(args, str):
                args = json.dumps(args)
            calls.append(ToolCall(id=c.get("id") or "", name=fn.get("name") or "", arguments=args, index=i))
        u, t, m = r.get("usage") or {}, r.get("timings") or {}, r.get("memory") or {}
        return cls(text=r.get("content") or "", reasoning=r.get("reasoning_content") or "",
                   tool_calls=tuple(calls), finish_reason=r.get("finish_reason") or "",
                   usage=Usage(_num(u, "prompt_tokens", int), _num(u, "cached_tokens", int),
                               _num(u, "completion_tokens", int)),
                   timings=Timings(_num(t, "prompt_ms", float), _num(t, "predicted_ms", float),
                                   _num(t, "prompt_per_second", float), _num(t, "predicted_per_second", float)),
                   memory=Memory(_num(m, "cells", int), _num(m, "compactions", int), str(m.get("cache") or "")),
                   stop_sequence=r.get("stop_sequence"), raw=r)


def tool_message(call: ToolCall, content: Any) -> Dict[str, Any]:
    """The tool message answering a call (content: a string, or any JSON value)."""
    text = content if isinstance(content, str) else json.dumps(content)
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": text}


# ---- events (Engine.stream, Engine.complete(on_event=...)) -------------------------------------


class Event:
    """Base class of the events a turn streams."""
    __slots__ = ()


@dataclass(frozen=True)
class PromptEvent(Event):
    """The request took a slot: its prompt's tokens, and of those the cached ones. First, before the prefill."""
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class TextDelta(Event):
    """A piece of the answer's text (str(delta) is the text)."""
    text: str

    def __str__(self):
        return self.text


@dataclass(frozen=True)
class ReasoningDelta(Event):
    """A piece of the reasoning (<think> ...)."""
    text: str

    def __str__(self):
        return self.text


@dataclass(frozen=True)
class ToolCallStart(Event):
    """A tool call begins."""
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallDelta(Event):
    """A piece of tool call `index`'s JSON arguments."""
    index: int
    arguments: str


@dataclass(frozen=True)
class ToolCallEvent(Event):
    """A tool call is complete (call.error says why it is malformed, or None)."""
    call: ToolCall


@dataclass(frozen=True)
class LogprobEvent(Event):
    """Requests with logprobs=True: one generated token's entry, before its text."""
    token: int
    logprob: float
    entry: Dict[str, Any]


@dataclass(frozen=True)
class Done(Event):
    """The turn ended: the whole result (usage, finish_reason, ...). Last."""
    completion: Completion

    @property
    def usage(self) -> Usage:
        return self.completion.usage

    @property
    def finish_reason(self) -> str:
        return self.completion.finish_reason
