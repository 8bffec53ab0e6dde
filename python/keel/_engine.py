"""keel.Engine: keel_engine_open / keel_complete / keel_engine_cancel /
keel_engine_close over ctypes (thread-safety rules: the package docstring)."""

import codecs
import ctypes
import json
import os
import queue
import threading
from ctypes import byref, c_int64, c_size_t, c_void_p

from . import _errors as E
from . import _lib as L
from ._types import (Completion, Done, LogprobEvent, PromptEvent, ReasoningDelta, TextDelta, ToolCall,
                     ToolCallDelta, ToolCallEvent, ToolCallStart)


def _dumps(value):
    return json.dumps(value).encode("utf-8")


def _messages(messages):
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return list(messages)


def _options(options):
    return {k: v for k, v in options.items() if v is not None}


class _Turn:
    """One keel_complete on the calling thread: converts its events, keeps the DONE response."""

    def __init__(self, engine, on_event):
        self.engine = engine
        self.on_event = on_event
        self.done_text = None
        self.raised = None
        self.stopped = False  # on_event returned False or raised
        self.dec = {}
        self.tools = {}  # index -> [id, name, [argument pieces]]

    def text(self, kind, data, final=False):
        d = self.dec.get(kind)
        if d is None:
            d = self.dec[kind] = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return d.decode(data, final)

    def convert(self, ev):
        k = ev.kind
        if k == L.EVENT_CONTENT:
            s = self.text(k, ev.data())
            return TextDelta(s) if s else None
        if k == L.EVENT_REASONING:
            s = self.text(k, ev.data())
            return ReasoningDelta(s) if s else None
        if k == L.EVENT_TOOL_BEGIN:
            cid = (ev.id or b"").decode("utf-8", "replace")
            name = (ev.name or b"").decode("utf-8", "replace")
            self.tools[ev.index] = [cid, name, []]
            return ToolCallStart(ev.index, cid, name)
        if k == L.EVENT_TOOL_ARGS:
            s = self.text((k, ev.index), ev.data())
            t = self.tools.get(ev.index)
            if t is not None:
                t[2].append(s)
            return ToolCallDelta(ev.index, s)
        if k == L.EVENT_TOOL_END:
            cid, name, parts = self.tools.pop(ev.index, ["", "", []])
            parts.append(self.text((L.EVENT_TOOL_ARGS, ev.index), b"", final=True))
            err = ev.error.decode("utf-8", "replace") if ev.error else None
            return ToolCallEvent(ToolCall(cid, name, "".join(parts), ev.index, err))
        if k == L.EVENT_PROMPT:
            return PromptEvent(ev.n_prompt_tokens, ev.n_cached_tokens)
        if k == L.EVENT_LOGPROB:
            entry = json.loads(ev.data().decode("utf-8", "replace")) if ev.len else {}
            return LogprobEvent(ev.token, ev.logprob, entry)
        if k == L.EVENT_DONE:
            self.done_text = (ev.response or b"").decode("utf-8", "replace")
            return None
        return None  # a kind a newer libkeel added

    def __call__(self, _user, ev_p):
        # nothing may unwind through C: an exception stops the turn and is raised after it
        try:
            ev = ev_p.contents
            out = self.convert(ev)
            if self.on_event is not None and out is not None and not self.stopped:
                if self.on_event(out) is False:
                    self.stopped = True
            return not (self.stopped or self.engine._cancel_flag)
        except BaseException as e:  # KeyboardInterrupt included: it cancels the turn
            if self.raised is None:
                self.raised = e
            self.stopped = True  # on_event is not called again (the turn's last events still come)
            return False


class Engine:
    """A keel engine: a model, its cache (shared by n_slots slots), its chat
    template and tool-call format (keel_engine_open).

        with keel.Engine("model.gguf", n_ctx=4096, n_threads=4) as engine:
            result = engine.complete([{"role": "user", "content": "Hi"}], max_tokens=64)
            print(result.text, result.usage.cached_tokens)

    options are keel_engine_open's JSON options (include/keel.h): n_ctx,
    n_slots, n_threads, type_k, type_v, kv_compact, chat_template,
    tool_format, tokenizer, ... (None values are left out). A bad option or
    an unreadable model raises a KeelError subclass naming it."""

    def __init__(self, model, **options):
        self._handle = None
        self._path, self._lib = L.load()
        self._mu = threading.Condition(threading.Lock())
        self._busy = False       # a turn runs (complete or stream)
        self._owner = None       # the thread that runs it (calls keel_complete)
        self._users = 0          # other calls in progress (stats, cancel, ...)
        self._closed = False
        self._cancel_flag = False
        self.model = os.fspath(model)
        opts = {"model": self.model}
        opts.update(_options(options))
        handle = c_void_p()
        err = ctypes.create_string_buffer(256)
        st = self._lib.keel_engine_open(_dumps(opts), byref(handle), err)
        if st != E.OK:
            msg = err.value.decode("utf-8", "replace") or self._lib.keel_strerror(st).decode()
            raise E.make_error(st, msg, self._status_name(st), "keel_engine_open")
        self._handle = handle.value

    # ---- lifetime ----------------------------------------------------------------------------

    def close(self):
        """Frees the engine (idempotent). From another thread while a turn
        runs: cancels it and waits for it to return first. Not from inside
        an on_event callback (StateError)."""
        with self._mu:
            if self._closed:
                return
            if self._busy and self._owner == threading.get_ident():
                raise E.StateError("close() called from inside this engine's running turn (an on_event "
                                   "callback); cancel() there and close after complete() returns",
                                   func="Engine.close")
            self._closed = True
            if self._busy:
                self._cancel_flag = True
                self._lib.keel_engine_cancel(self._handle)
            while self._busy or self._users:
                self._mu.wait()
            handle, self._handle = self._handle, None
        if handle:
            self._lib.keel_engine_close(handle)

    @property
    def closed(self):
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            if self._handle and not self._busy:
                self.close()
        except Exception:
            pass

    # ---- helpers -----------------------------------------------------------------------------

    def _status_name(self, st):
        name = self._lib.keel_status_name(st)
        return name.decode() if name else None

    def _error(self, st, func, response=None):
        msg = (self._lib.keel_engine_last_error(self._handle) or b"").decode("utf-8", "replace")
        if not msg:
            msg = self._lib.keel_strerror(st).decode()
        return E.make_error(st, msg, self._status_name(st), func, response)

    def _enter(self):
        with self._mu:
            if self._closed:
                raise E.StateError("the engine is closed", func="keel.Engine")
            self._users += 1
            return self._handle

    def _leave(self):
        with self._mu:
            self._users -= 1
            self._mu.notify_all()

    def _begin(self, owner):
        with self._mu:
            if self._closed:
                raise E.StateError("the engine is closed", func="keel.Engine")
            if self._busy:
                raise E.StateError("another complete() or stream() is running on this engine (one turn at "
                                   "a time per engine; open another Engine, or wait)", func="keel.Engine")
            self._busy = True
            self._owner = owner
            self._cancel_flag = False
            return self._handle

    def _end(self):
        with self._mu:
            self._busy = False
            self._owner = None
            self._mu.notify_all()

    def _request(self, messages, tools, options):
        m = _dumps(_messages(messages))
        t = _dumps(list(tools)) if tools else None
        o = _options(options)
        return m, t, (_dumps(o) if o else None)

    def _run(self, handle, req, on_event):
        """keel_complete on this thread (the turn is begun); returns the Completion or raises."""
        turn = _Turn(self, on_event)
        cb = L.EVENT_FN(turn)  # referenced until keel_complete returns
        st = self._lib.keel_complete(handle, req[0], req[2], req[1], cb, None, None, 0)
        completion = None
        if turn.done_text:
            try:
                completion = Completion.from_json(turn.done_text)
            except ValueError as e:
                raise E.InternalError(f"the response is not valid JSON ({e}): {turn.done_text[:200]!r}",
                                      func="keel_complete") from None
        if st not in (E.OK, E.ECANCELED):
            raise self._error(st, "keel_complete", completion)
        if turn.raised is not None:
            raise turn.raised
        if completion is None:  # cancelled before the request was queued: the engine is closing
            raise self._error(st, "keel_complete")
        if on_event is not None:
            on_event(Done(completion))
        return completion

    # ---- turns -------------------------------------------------------------------------------

    def complete(self, messages, tools=None, *, on_event=None, **options):
        """One chat turn, synchronously on the calling thread (keel_complete).

        messages: an OpenAI messages list (or a string: one user message);
        tools: an OpenAI tools list or None; options: keel_complete's
        request options (max_tokens, temperature, seed, stop, kv_compact,
        tool_choice, grammar, response_format, ...). on_event(event), if
        given, receives each event on this thread while the turn runs;
        returning False stops the turn (finish_reason "cancelled").

        Returns a Completion; a cancelled turn (cancel(), on_event, Ctrl-C)
        returns one with finish_reason "cancelled" (an exception in on_event,
        KeyboardInterrupt included, cancels the turn and is re-raised).
        Raises a KeelError subclass with keel's status and message."""
        req = self._request(messages, tools, options)
        handle = self._begin(threading.get_ident())
        try:
            return self._run(handle, req, on_event)
        finally:
            self._end()

    def stream(self, messages, tools=None, **options):
        """One chat turn, streamed: returns a Stream, an iterator of events
        (TextDelta, ReasoningDelta, ToolCallStart, ToolCallDelta,
        ToolCallEvent, PromptEvent, LogprobEvent) ending with Done (the
        Completion). keel runs the turn on a worker thread of the package;
        the events are yielded on the thread that iterates. Closing the
        Stream (or leaving a `with` block or the loop early and dropping
        it) cancels the turn. Errors are raised by the iteration."""
        req = self._request(messages, tools, options)
        return Stream(self, req)

    def cancel(self):
        """Cancels the running turn, if any (thread-safe; returns at once:
        the turn ends at its next step with finish_reason "cancelled")."""
        with self._mu:
            if self._busy and self._handle:
                self._cancel_flag = True
                self._lib.keel_engine_cancel(self._handle)

    # ---- the rest of the engine ---------------------------------------------------------------

    def _sized(self, func, name):
        handle = self._enter()
        try:
            n = c_size_t(0)
            cap = 8192
            while True:
                buf = ctypes.create_string_buffer(cap)
                st = func(handle, buf, cap, byref(n))
                if st == E.ERANGE and n.value > cap:
                    cap = n.value
                    continue
                if st != E.OK:
                    raise self._error(st, name)
                return buf.value.decode("utf-8", "replace")
        finally:
            self._leave()

    def stats(self):
        """Slots, requests, tokens and the memory plan (keel_engine_stats) as a dict. Thread-safe."""
        return json.loads(self._sized(self._lib.keel_engine_stats, "keel_engine_stats"))

    def reset(self):
        """Forgets every slot's cached conversation (keel_engine_reset; StateError while a turn runs)."""
        handle = self._enter()
        try:
            st = self._lib.keel_engine_reset(handle)
            if st != E.OK:
                raise self._error(st, "keel_engine_reset")
        finally:
            self._leave()

    def count_tokens(self, messages, tools=None, **options):
        """The prompt tokens a request renders to (keel_engine_count_tokens). Thread-safe."""
        req = {"messages": _messages(messages)}
        if tools:
            req["tools"] = list(tools)
        req.update(_options(options))
        handle = self._enter()
        try:
            n = c_int64(0)
            st = self._lib.keel_engine_count_tokens(handle, _dumps(req), byref(n))
            if st != E.OK:
                raise self._error(st, "keel_engine_count_tokens")
            return n.value
        finally:
            self._leave()

    def _slot_action(self, func, name, slot, path):
        handle = self._enter()
        try:
            info = ctypes.create_string_buffer(1024)
            st = func(handle, slot, os.fsencode(path), info, len(info))
            if st not in (E.OK, E.ERANGE):
                raise self._error(st, name)
            try:
                return json.loads(info.value.decode("utf-8", "replace")) if st == E.OK else {}
            except ValueError:
                return {}
        finally:
            self._leave()

    def save(self, path, slot=0):
        """Saves a slot's cache and token history to path (keel_engine_slot_save); returns its info dict."""
        return self._slot_action(self._lib.keel_engine_slot_save, "keel_engine_slot_save", slot, path)

    def restore(self, path, slot=0):
        """Loads a file of save() into a slot (validated first; the slot is unchanged on error)."""
        return self._slot_action(self._lib.keel_engine_slot_restore, "keel_engine_slot_restore", slot, path)


_END = object()


class Stream:
    """The events of one streamed turn (Engine.stream). Iterate it; after
    the Done event, .completion holds the result."""

    def __init__(self, engine, req):
        self._engine = engine
        self._q = queue.SimpleQueue()
        self._finished = False
        self.completion = None
        self._started = threading.Event()
        handle = engine._begin(None)
        try:
            self._thread = threading.Thread(target=self._work, args=(handle, req), name="keel-stream", daemon=True)
            self._thread.start()
        except BaseException:
            engine._end()
            raise
        self._started.wait()

    def _work(self, handle, req):
        eng = self._engine
        with eng._mu:
            eng._owner = threading.get_ident()
        self._started.set()
        try:
            try:
                eng._run(handle, req, self._q.put)
            except BaseException as e:
                self._q.put(e)
        finally:
            eng._end()
            self._q.put(_END)

    def __iter__(self):
        return self

    def __next__(self):
        if self._finished:
            raise StopIteration
        item = self._q.get()
        if item is _END:
            self._finished = True
            self._thread.join()
            raise StopIteration
        if isinstance(item, BaseException):
            self._finished = True
            self._thread.join()
            raise item
        if isinstance(item, Done):
            self.completion = item.completion
        return item

    def text(self):
        """Consumes the stream; returns the answer's text (the Completion is then in .completion)."""
        return "".join(e.text for e in self if isinstance(e, TextDelta))

    def cancel(self):
        """Cancels the turn (thread-safe); the stream still ends with Done (finish_reason "cancelled")."""
        if not self._finished and self._thread.is_alive():
            self._engine.cancel()

    def close(self):
        """Cancels the turn if it still runs and waits for its thread."""
        if self._finished:
            return
        if self._thread.is_alive():
            self._engine.cancel()
        self._thread.join()
        self._finished = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
