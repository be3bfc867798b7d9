"""A chat client for OpenAI-compatible endpoints (vLLM, TGI, hosted APIs), built for long, resumable jobs.

- ``POST {base_url}/chat/completions`` with the standard library (``urllib``): no extra dependency.
- Three limits on each request: the connection (TCP and TLS) within ``CONNECT_TIMEOUT_S`` (at most ``timeout_s``),
  each read within ``timeout_s``, and the whole answer within ``timeout_s`` of sending (an endpoint that trickles
  bytes is cut off there); past any of them the request is a timeout, retried as below.
- The key comes from the environment variable ``api_key_env`` (default ``OPENAI_API_KEY``); no variable or an
  empty one sends no ``Authorization`` header (a local vLLM needs none).
- Retries on 429, 408, 409, 5xx, timeouts, connection errors and unreadable responses: exponential backoff with
  jitter (``backoff_s * 2**retry``, capped at ``backoff_max_s``, the wait drawn from its upper half), or exactly
  the server's ``Retry-After`` (seconds or an HTTP date, capped at ``retry_after_max_s``) when it sends one.
- 401 / 403 / 404 (bad key, wrong base URL or model) stop the whole job at once (``LLMFatalError``), and so does
  a run of ``max_consecutive_failures`` requests that failed after all their retries (the endpoint is down).
  Other failures are per request (``LLMRequestError``): the job counts them and goes on.
- On-disk cache (``ResponseCache``, ``jaxembed.synth.cache``): every answer is appended to ``responses.jsonl`` under a key that hashes
  (model, messages, sampling parameters, salt). A killed job, run again, finds its answers there and sends no
  request for them. The salt tells apart requests that are identical on purpose (two examples for one task, the
  n-th retry of a malformed answer). Several jobs may share one cache file: appends are whole lines under a file
  lock, and each job sees the answers the others stored.
- ``Stats``: logical calls, cache hits, HTTP requests, retries and failures by reason, tokens and cost (price per
  1k prompt / completion tokens), time spent waiting.
- ``ChatClient.map`` runs a function over many items on ``concurrency`` threads with a tqdm progress bar.
- ``ask_json``: one question whose answer must be JSON that a validator accepts; a malformed answer is asked
  again (a new salt, so not the cached answer) up to ``attempts`` times, then reported, never raised.

Why not the ``openai`` client or ``httpx`` with a retry library: the retry policy above is the job's, whatever
sends the bytes, and the tests pin it (Retry-After in seconds or as an HTTP date, up to ``retry_after_max_s``;
the jittered backoff; retries and failures counted by reason; one job-wide stop after 401 / 403 / 404 or
``max_consecutive_failures``; an injectable ``sleep``). The ``openai`` client retries its own way (0.5 s doubling
to at most 8 s, Retry-After honoured only up to 60 s, no job-wide stop), so it would run with ``max_retries=0``
under this loop anyway, and it brings pydantic, httpx, anyio, distro and jiter. ``httpx`` would replace only the
~30 lines of ``_post_once`` that map urllib's errors (it needs the same mapping of its own exceptions), and a
retry library (tenacity, not installed) would still need every custom piece above as callbacks. So the standard
library stays: no dependency for ``jaxembed synth`` / ``judge``, and the loop reads top to bottom.
"""

from __future__ import annotations

import dataclasses
import email.utils
import json
import logging
import os
import random
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Callable, Iterable, Sequence

from tqdm.auto import tqdm

from jaxembed.errors import UserError
from jaxembed.synth.cache import ResponseCache, cache_key
from jaxembed.synth.transport import build_opener, read_by

log = logging.getLogger(__name__)

RETRY_STATUS = (408, 409, 429, 500, 502, 503, 504)
#: the longest wait for a connection to the endpoint (TCP and TLS), capped at the request's ``timeout_s``
CONNECT_TIMEOUT_S = 10.0
FATAL_STATUS = {401: "unauthorized: check the key in ${env}",
                403: "forbidden: the key in ${env} has no access to this model",
                404: "not found: check --base-url (it usually ends in /v1) and --model"}


class LLMRequestError(Exception):
    """One request failed after all its retries (``reason``: 'http 500', 'timeout', 'connection error', ...)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


class LLMFatalError(UserError):
    """The job cannot go on: bad key, wrong URL or model, or the endpoint is down. Rerunning resumes."""


class AnswerError(ValueError):
    """An answer that is not what was asked for (invalid JSON, a missing key ...); ``reason`` is short, for
    counting."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


# ------------------------------------------------------------------------------------------------- config

@dataclasses.dataclass
class LLMConfig:
    """Endpoint, sampling, retry and price settings of a job (every field has a CLI flag, see synth/cli.py)."""

    base_url: str = "http://localhost:8000/v1"
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = 8             # requests in flight at once (threads)
    timeout_s: float = 120.0         # per request: each read, and the whole answer (connecting: CONNECT_TIMEOUT_S)
    max_retries: int = 6             # retries of one request on 429 / 5xx / timeout / connection errors
    backoff_s: float = 1.0           # first backoff; doubles per retry
    backoff_max_s: float = 60.0
    retry_after_max_s: float = 300.0  # longest Retry-After honoured
    max_consecutive_failures: int = 20  # requests failed in a row (after retries) that stop the job
    temperature: float = 1.0
    top_p: float | None = None
    max_tokens: int = 2048
    seed_per_request: bool = False   # send a seed derived from the cache salt (vLLM, OpenAI: reproducible samples)
    extra_body: dict = dataclasses.field(default_factory=dict)  # more request fields, e.g. {"top_k": 20}
    price_prompt_per_1k: float = 0.0      # cost accounting, in your currency per 1,000 tokens
    price_completion_per_1k: float = 0.0
    progress: bool | None = None     # progress bars (None: on a terminal)

    def validate(self) -> None:
        if not self.model:
            raise UserError("llm model: required (fix: --model NAME, the name the endpoint serves, e.g. "
                            "Qwen/Qwen2-72B-Instruct)")
        if not re.match(r"^https?://", self.base_url or ""):
            raise UserError(f"--base-url {self.base_url!r}: expected http://HOST:PORT/v1 or https://...")
        for k in ("concurrency", "max_consecutive_failures", "max_tokens"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise UserError(f"llm {k}: {v!r} must be an integer >= 1")
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise UserError(f"llm max_retries: {self.max_retries!r} must be an integer >= 0")
        for k in ("timeout_s", "backoff_s", "backoff_max_s", "retry_after_max_s", "price_prompt_per_1k",
                  "price_completion_per_1k", "temperature"):
            v = getattr(self, k)
            if not isinstance(v, (int, float)) or v < 0 or (k == "timeout_s" and v == 0):
                raise UserError(f"llm {k}: {v!r} must be a number >= 0" + (" (> 0)" if k == "timeout_s" else ""))

    def public(self) -> dict:
        """The settings as JSON (no key: only the variable's name)."""
        return dataclasses.asdict(self)


# -------------------------------------------------------------------------------------------------- stats

class Stats:
    """Thread-safe counters of a job's traffic."""

    def __init__(self):
        self._lock = threading.Lock()
        self.calls = 0              # logical chat() calls
        self.cache_hits = 0
        self.requests = 0           # HTTP requests sent (retries included)
        self.ok = 0                 # successful responses received
        self.retries: Counter = Counter()    # reason -> retries
        self.failures: Counter = Counter()   # reason -> requests failed after all retries
        self.prompt_tokens = 0      # of the requests sent in this run
        self.completion_tokens = 0
        self.cached_prompt_tokens = 0  # of the answers served from the cache (paid in an earlier run)
        self.cached_completion_tokens = 0
        self.wait_s = 0.0           # time spent in backoff / Retry-After

    def add(self, **kw) -> None:
        with self._lock:
            for k, v in kw.items():
                if k in ("retries", "failures"):
                    getattr(self, k)[v] += 1
                else:
                    setattr(self, k, getattr(self, k) + v)

    def cost(self, cfg: LLMConfig) -> float:
        return (self.prompt_tokens * cfg.price_prompt_per_1k + self.completion_tokens * cfg.price_completion_per_1k
                ) / 1000.0

    def to_dict(self, cfg: LLMConfig | None = None) -> dict:
        with self._lock:
            d = {"calls": self.calls, "cache_hits": self.cache_hits, "requests": self.requests, "ok": self.ok,
                 "retries": dict(self.retries.most_common()), "retries_total": sum(self.retries.values()),
                 "failures": dict(self.failures.most_common()), "failures_total": sum(self.failures.values()),
                 "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                 "cached_prompt_tokens": self.cached_prompt_tokens,
                 "cached_completion_tokens": self.cached_completion_tokens,
                 "wait_s": round(self.wait_s, 3)}
        if cfg is not None:
            d["cost"] = round(self.cost(cfg), 6)
            d["cost_if_uncached"] = round(((self.prompt_tokens + self.cached_prompt_tokens) * cfg.price_prompt_per_1k
                                           + (self.completion_tokens + self.cached_completion_tokens)
                                           * cfg.price_completion_per_1k) / 1000.0, 6)
        return d

    def summary(self, cfg: LLMConfig) -> str:
        d = self.to_dict(cfg)
        s = (f"{d['calls']} calls: {d['cache_hits']} from the cache, {d['requests']} requests sent "
             f"({d['ok']} ok, {d['retries_total']} retries, {d['failures_total']} failed); "
             f"{d['prompt_tokens']} prompt + {d['completion_tokens']} completion tokens, cost {d['cost']:.4f}")
        if d["retries"]:
            s += "; retries: " + ", ".join(f"{k} x{v}" for k, v in d["retries"].items())
        if d["failures"]:
            s += "; failures: " + ", ".join(f"{k} x{v}" for k, v in d["failures"].items())
        return s


# ------------------------------------------------------------------------------------------------- client

@dataclasses.dataclass
class ChatResult:
    text: str
    finish_reason: str | None
    usage: dict
    cached: bool
    key: str


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: a number of seconds or an HTTP date; None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class ChatClient:
    """``chat(messages, salt=...)`` with cache, retries and accounting; ``map(fn, items)`` over threads."""

    def __init__(self, cfg: LLMConfig, cache_path: str | os.PathLike, *, sleep: Callable[[float], None] = time.sleep):
        cfg.validate()
        self.cfg = cfg
        self.url = cfg.base_url.rstrip("/") + "/chat/completions"
        self.cache = ResponseCache(cache_path)
        self.stats = Stats()
        self._sleep = sleep
        self._key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        self._lock = threading.Lock()
        self._consecutive = 0
        self._abort: LLMFatalError | None = None
        connect = min(CONNECT_TIMEOUT_S, cfg.timeout_s)
        self._opener = build_opener(connect)

    # -- one call
    def params(self, **overrides) -> dict:
        """The sampling parameters of a request (part of the cache key)."""
        p = {"temperature": self.cfg.temperature, "max_tokens": self.cfg.max_tokens}
        if self.cfg.top_p is not None:
            p["top_p"] = self.cfg.top_p
        p.update(self.cfg.extra_body)
        p.update({k: v for k, v in overrides.items() if v is not None})
        return p

    def chat(self, messages: Sequence[dict], *, salt: str = "", **overrides) -> ChatResult:
        """The answer to ``messages`` (from the cache when this (model, messages, params, salt) was answered
        before). Raises LLMRequestError after all retries, LLMFatalError when the job must stop."""
        if self._abort is not None:
            raise self._abort
        params = self.params(**overrides)
        key = cache_key(self.cfg.model, messages, params, salt)
        self.stats.add(calls=1)
        hit = self.cache.get(key)
        if hit is not None:
            u = hit.get("usage") or {}
            self.stats.add(cache_hits=1, cached_prompt_tokens=int(u.get("prompt_tokens") or 0),
                           cached_completion_tokens=int(u.get("completion_tokens") or 0))
            return ChatResult(hit["content"], hit.get("finish_reason"), u, True, key)
        body = {"model": self.cfg.model, "messages": list(messages), **params}
        if self.cfg.seed_per_request:
            body["seed"] = int(key[:8], 16) & 0x7FFFFFFF
        resp = self._post_with_retries(body)
        choice = resp["choices"][0]
        u = resp.get("usage") or {}
        usage = {"prompt_tokens": int(u.get("prompt_tokens") or 0),
                 "completion_tokens": int(u.get("completion_tokens") or 0)}
        self.stats.add(prompt_tokens=usage["prompt_tokens"], completion_tokens=usage["completion_tokens"])
        out = {"content": choice["message"]["content"], "finish_reason": choice.get("finish_reason"),
               "usage": usage}
        out = self.cache.put(key, out, {"salt": salt})  # another process may have stored an answer first: that one
        return ChatResult(out["content"], out.get("finish_reason"), usage, False, key)

    def _post_with_retries(self, body: dict) -> dict:
        data = json.dumps(body, ensure_ascii=False).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        last = None
        for attempt in range(self.cfg.max_retries + 1):
            if self._abort is not None:
                raise self._abort
            reason, retry_after, detail = self._post_once(data, headers)
            if reason is None:
                with self._lock:
                    self._consecutive = 0
                return detail
            last = (reason, detail)
            if attempt == self.cfg.max_retries:
                break
            self.stats.add(retries=reason)
            if retry_after is not None:
                wait = min(retry_after, self.cfg.retry_after_max_s)
            else:
                d = min(self.cfg.backoff_max_s, self.cfg.backoff_s * (2 ** attempt))
                wait = d / 2 + random.uniform(0, d / 2)
            self.stats.add(wait_s=wait)
            log.info("%s (%s); retry %d of %d in %.2fs", reason, detail, attempt + 1, self.cfg.max_retries, wait)
            self._sleep(wait)
        reason, detail = last
        self.stats.add(failures=reason)
        with self._lock:
            self._consecutive += 1
            if self._consecutive >= self.cfg.max_consecutive_failures and self._abort is None:
                self._abort = LLMFatalError(
                    f"{self.url}: {self._consecutive} requests in a row failed after {self.cfg.max_retries} retries "
                    f"each (last: {reason}: {detail}); the endpoint looks down or overloaded (fix: check the "
                    "server, lower --concurrency or raise --timeout, then run the same command again: the answers "
                    f"so far are cached in {self.cache.path})")
        raise LLMRequestError(reason, detail)

    def _post_once(self, data: bytes, headers: dict) -> tuple[str | None, float | None, Any]:
        """(None, None, response JSON) on success, else (retryable reason, Retry-After seconds, detail).
        Raises LLMFatalError for 401 / 403 / 404 and LLMRequestError for other non-retryable statuses."""
        req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        self.stats.add(requests=1)
        late = "timeout", None, f"no answer within {self.cfg.timeout_s:g}s"
        deadline = time.monotonic() + self.cfg.timeout_s
        try:
            with self._opener.open(req, timeout=self.cfg.timeout_s) as r:
                raw = read_by(r, deadline)
            if raw is None:
                return late
        except urllib.error.HTTPError as e:
            text = _error_text(e)
            if e.code in FATAL_STATUS:
                msg = FATAL_STATUS[e.code].replace("${env}", f"${self.cfg.api_key_env}")
                err = LLMFatalError(f"{self.url}: HTTP {e.code} {msg} (model {self.cfg.model!r}; server said: "
                                    f"{text[:200]})")
                with self._lock:
                    self._abort = self._abort or err
                raise err from None
            if e.code in RETRY_STATUS:
                return f"http {e.code}", parse_retry_after(e.headers.get("Retry-After")), text[:200]
            self.stats.add(failures=f"http {e.code}")
            raise LLMRequestError(f"http {e.code}", text[:200]) from None
        except TimeoutError:
            return late
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):  # socket.timeout is TimeoutError
                return late
            return "connection error", None, str(e.reason)[:200]
        except (ConnectionError, OSError) as e:  # reset / refused / broken pipe, http.client errors
            return "connection error", None, f"{type(e).__name__}: {e}"[:200]
        try:
            resp = json.loads(raw)
            content = resp["choices"][0]["message"]["content"]
            if not isinstance(content, str):
                raise TypeError(f"content is {type(content).__name__}")
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, IndexError, TypeError) as e:
            return "bad response", None, f"{type(e).__name__}: {e}"[:200]
        self.stats.add(ok=1)
        return None, None, resp

    # -- many calls
    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], desc: str = "llm") -> list:
        """``[fn(item) for item in items]`` on ``concurrency`` threads, in input order, with a progress bar.
        An LLMFatalError stops the pool (queued items are cancelled) and is raised."""
        items = list(items)
        out: list = [None] * len(items)
        show = sys.stderr.isatty() if self.cfg.progress is None else self.cfg.progress
        with tqdm(total=len(items), desc=desc, unit="req", dynamic_ncols=True, disable=not show) as bar, \
                ThreadPoolExecutor(max_workers=self.cfg.concurrency) as pool:
            futures = {pool.submit(fn, it): i for i, it in enumerate(items)}
            try:
                for fut in as_completed(futures):
                    out[futures[fut]] = fut.result()
                    bar.update(1)
                    bar.set_postfix(cached=self.stats.cache_hits, failed=sum(self.stats.failures.values()),
                                    refresh=False)
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise
        return out

    def close(self) -> None:
        self.cache.close()


def _error_text(e: urllib.error.HTTPError) -> str:
    try:
        return e.read().decode("utf-8", "replace").strip().replace("\n", " ")
    except Exception:  # noqa: BLE001 -- the body of an error is only for the message
        return ""


# ------------------------------------------------------------------------------------------ JSON answers

_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```$", re.S)


def parse_json(text: str) -> Any:
    """The JSON value of an answer: the whole text (surrounding whitespace and one Markdown code fence allowed)
    must be one JSON value. Raises AnswerError('invalid JSON')."""
    s = (text or "").strip()
    m = _FENCE.match(s)
    if m:
        s = m.group(1).strip()
    if not s:
        raise AnswerError("empty answer")
    try:
        return json.loads(s)
    except json.JSONDecodeError as e:
        raise AnswerError("invalid JSON", f"{e.msg} at line {e.lineno} column {e.colno}") from None


@dataclasses.dataclass
class Outcome:
    """The result of ``ask_json``: ``value`` (validated) or None, and why not."""

    value: Any = None
    reasons: list = dataclasses.field(default_factory=list)  # one per rejected answer, e.g. "invalid JSON"
    request_error: str | None = None  # the request itself failed (after its retries)
    attempts: int = 0
    last_text: str = ""
    cached: int = 0  # answers that came from the cache

    @property
    def ok(self) -> bool:
        return self.value is not None

    @property
    def reason(self) -> str:
        """Why there is no value: the request failure, else the last rejection."""
        if self.request_error:
            return f"request failed: {self.request_error}"
        return self.reasons[-1] if self.reasons else "no answer"


def ask_json(client: ChatClient, messages: Sequence[dict], validate: Callable[[Any], Any], *, salt: str,
             attempts: int = 3, **overrides) -> Outcome:
    """Ask until ``validate(parse_json(answer))`` succeeds, at most ``attempts`` times (attempt k uses the salt
    ``salt#k``, so a rerun finds every attempt in the cache). ``validate`` returns the cleaned value or raises
    AnswerError. Never raises for a bad answer or a failed request; LLMFatalError does propagate."""
    out = Outcome()
    for k in range(attempts):
        out.attempts = k + 1
        try:
            r = client.chat(messages, salt=f"{salt}#{k}", **overrides)
        except LLMRequestError as e:
            out.request_error = e.reason
            return out
        out.cached += r.cached
        out.last_text = r.text
        try:
            value = parse_json(r.text)
            out.value = validate(value)
            if out.value is None:
                raise AnswerError("rejected by the validator")
            return out
        except AnswerError as e:
            reason = e.reason
            if r.finish_reason == "length" and reason in ("invalid JSON", "empty answer"):
                reason = "truncated (finish_reason=length)"
            out.reasons.append(reason)
    return out
