"""LLM-backed data tools against OpenAI-compatible chat endpoints (vLLM, TGI, hosted APIs).

- ``client``: the chat client (cache keyed by prompt, retries with backoff, Retry-After, timeouts, concurrency,
  token and cost accounting) and ``ask_json`` (strict JSON answers, malformed ones asked again then reported);
  ``cache``: its on-disk answer cache;
- ``personas``: KaLM persona-based synthetic data for six task families (the job); ``prompts``: the families,
  their prompts and the validators of the answers;
- ``judge``: PEG's false-negative judge over mined hard negatives;
- ``cli``: ``jaxembed synth personas`` and ``jaxembed judge``.
"""

from jaxembed.synth.client import (AnswerError, ChatClient, LLMConfig, LLMFatalError, LLMRequestError, Outcome,
                                   ask_json, parse_json)

__all__ = ["AnswerError", "ChatClient", "LLMConfig", "LLMFatalError", "LLMRequestError", "Outcome", "ask_json",
           "parse_json"]
