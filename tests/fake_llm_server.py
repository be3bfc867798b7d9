"""A local OpenAI-compatible chat endpoint for tests: ``POST /v1/chat/completions`` on 127.0.0.1 (ephemeral port),
served by a ThreadingHTTPServer in a background thread.

By default it answers like a cooperative LLM, reading what the prompt asks for (see ``smart_answer``):
- "a JSON list of N strings"  -> N task descriptions, unique per prompt (persona) and per repeat;
- '"answers_query"'           -> a judge verdict: true when the passage contains the word ANSWERS;
- '- "key": ...' lines        -> a JSON object with those keys and distinct, non-empty string values.

``script(match, *actions, same_prompt=False)`` queues actions for the next requests whose messages contain ``match``; an action is a
dict with any of ``status`` (HTTP status, default 200), ``retry_after`` (header value), ``sleep`` (seconds before
answering: longer than the client's timeout means a timeout), ``content`` (the answer text), ``finish_reason``.
``budget`` = N: the endpoint answers N more requests, then every request gets 503 (it went down); ``fail_all``
applies one action to every request. ``log`` records every request (time, status, prompt hash); ``count(...)``
counts them.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _h(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def smart_answer(messages: list[dict], n: int) -> str:
    """A valid answer to the prompts of jaxembed.synth (n: how many times this exact prompt was asked before)."""
    system = "".join(m["content"] for m in messages if m["role"] == "system")
    user = messages[-1]["content"]
    h = _h(system + user)
    if '"answers_query"' in user:
        passage = user.split("Passage:", 1)[1] if "Passage:" in user else user
        passage = passage.split("Answer with", 1)[0]
        return json.dumps({"answers_query": "ANSWERS" in passage})
    m = re.search(r"JSON list of (\d+) strings", user)
    if m:
        k = int(m.group(1))
        return json.dumps([f"Given a question about topic {h}-{n}-{i}, retrieve passages that answer it."
                           for i in range(k)])
    keys = re.findall(r'^- "(\w+)":', user, re.M)
    if keys:
        words = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor".split()
        return json.dumps({k: f"{k.replace('_', ' ')} {h} {n} " + " ".join(words[: 3 + j % 7])
                           for j, k in enumerate(keys)})
    return "I do not understand the request."


class FakeLLM:
    """Start with ``start()`` (returns the base URL, ending in /v1), stop with ``stop()``; also a context manager."""

    def __init__(self, api_key: str | None = None, answer=smart_answer):
        self.api_key = api_key
        self.answer = answer
        self.log: list[dict] = []
        self._scripts: list[tuple[str, list[dict]]] = []
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.fail_all: dict | None = None  # an action applied to every request (e.g. the endpoint is down)
        self.budget: int | None = None     # answers left before the endpoint goes down (503); None = no limit

    # ---- control
    def script(self, match: str, *actions: dict, same_prompt: bool = False) -> None:
        """Queue ``actions`` for the next requests whose messages contain ``match``. same_prompt: after the first
        action, only requests with exactly that first request's messages get the rest (one item's retries)."""
        with self._lock:
            self._scripts.append([match, list(actions), same_prompt])

    def count(self, status: int | None = None, match: str | None = None) -> int:
        with self._lock:
            return sum(1 for r in self.log if (status is None or r["status"] == status)
                       and (match is None or match in r["text"]))

    def reset_log(self) -> None:
        with self._lock:
            self.log.clear()

    # ---- server
    def start(self) -> str:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                fake._handle(self, body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        self.url = self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    # ---- one request
    def _action(self, text: str) -> dict:
        with self._lock:
            if self.fail_all is not None:
                return dict(self.fail_all)
            if self.budget is not None:
                if self.budget <= 0:
                    return {"status": 503}
                self.budget -= 1
            for sc in self._scripts:
                match, actions, same = sc
                if actions and (match == text if same == "exact" else match in text):
                    if same is True:
                        sc[0], sc[2] = text, "exact"
                    return actions.pop(0)
        return {}

    def _handle(self, h: BaseHTTPRequestHandler, body: dict) -> None:
        messages = body.get("messages") or []
        text = "\n".join(str(m.get("content", "")) for m in messages)
        if h.path != "/v1/chat/completions":
            return self._send(h, 404, {"error": {"message": f"no route {h.path}"}}, text)
        if self.api_key is not None and h.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self._send(h, 401, {"error": {"message": "invalid api key"}}, text)
        act = self._action(text)
        status = act.get("status", 200)
        self._record(status, text)  # logged on arrival (a request the client gives up on is counted too)
        if act.get("sleep"):
            time.sleep(act["sleep"])
        if status != 200:
            headers = {"Retry-After": str(act["retry_after"])} if "retry_after" in act else {}
            return self._send(h, status, {"error": {"message": f"scripted {status}"}}, text, headers, log=False)
        key = _h(text)
        with self._lock:
            seen = self._seen.get(key, 0)
            self._seen[key] = seen + 1
        content = act["content"] if "content" in act else self.answer(messages, seen)
        resp = {"id": f"fake-{key}-{seen}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "finish_reason": act.get("finish_reason", "stop")}],
                "usage": {"prompt_tokens": len(text) // 4 + 1, "completion_tokens": len(content) // 4 + 1,
                          "total_tokens": len(text) // 4 + len(content) // 4 + 2}}
        self._send(h, 200, resp, text, log=False)

    def _record(self, status: int, text: str) -> None:
        with self._lock:
            self.log.append({"time": time.time(), "status": status, "text": text, "key": _h(text)})

    def _send(self, h, status: int, obj: dict, text: str, headers: dict | None = None, log: bool = True) -> None:
        if log:
            self._record(status, text)
        data = json.dumps(obj).encode()
        try:
            h.send_response(status)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            pass
