"""``jaxembed synth personas`` and ``jaxembed judge``: LLM-backed data tools against an OpenAI-compatible endpoint.

``add_parsers(subparsers)`` adds both commands (``func`` returns the exit status; a UserError, including an
LLMFatalError such as a bad key or an unreachable endpoint, is printed on one line by the main CLI, exit 2).

- ``synth personas --personas FILE --out DIR --model NAME [--base-url URL] ...``: persona-based synthetic data
  (jaxembed.synth.personas); writes datasets + a data config + report.json into DIR.
- ``judge --input MINED.jsonl --out FILTERED.jsonl --model NAME ...``: drops the hard negatives the LLM judges to
  answer their query (jaxembed.synth.judge); writes FILTERED.report.json and FILTERED.dropped.jsonl.
Both resume: rerun the same command and every cached answer is reused.
"""

from __future__ import annotations

import argparse

from jaxembed.synth.client import LLMConfig


def _llm_args(p: argparse.ArgumentParser, temperature: float, max_tokens: int) -> None:
    g = p.add_argument_group("LLM endpoint (OpenAI-compatible: vLLM, TGI, hosted APIs)")
    g.add_argument("--base-url", default="http://localhost:8000/v1",
                   help="the API root, ending in /v1 (default http://localhost:8000/v1, vLLM's)")
    g.add_argument("--model", required=True, help="model name as the endpoint serves it")
    g.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="VAR",
                   help="environment variable holding the API key (default OPENAI_API_KEY; unset = no key)")
    g.add_argument("--concurrency", type=int, default=8, help="requests in flight at once (default 8)")
    g.add_argument("--timeout", type=float, default=120.0, metavar="S", help="seconds per request (default 120)")
    g.add_argument("--max-retries", type=int, default=6, help="retries on 429 / 5xx / timeouts (default 6)")
    g.add_argument("--max-failures-in-a-row", type=int, default=20, metavar="N",
                   help="stop the job when N requests in a row failed after their retries (default 20)")
    g.add_argument("--backoff", type=float, default=1.0, metavar="S",
                   help="first retry wait, doubled each retry, with jitter (default 1; Retry-After wins)")
    g.add_argument("--temperature", type=float, default=temperature)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--max-tokens", type=int, default=max_tokens)
    g.add_argument("--seed-per-request", action="store_true",
                   help="send a per-request seed (reproducible samples on vLLM / OpenAI)")
    g.add_argument("--price-prompt", type=float, default=0.0, metavar="X", help="cost per 1k prompt tokens")
    g.add_argument("--price-completion", type=float, default=0.0, metavar="X",
                   help="cost per 1k completion tokens")
    g.add_argument("--cache", default="", metavar="FILE", help="the answers cache (default: next to the output)")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def _llm_config(a) -> LLMConfig:
    return LLMConfig(base_url=a.base_url, model=a.model, api_key_env=a.api_key_env, concurrency=a.concurrency,
                     timeout_s=a.timeout, max_retries=a.max_retries, backoff_s=a.backoff,
                     max_consecutive_failures=a.max_failures_in_a_row,
                     temperature=a.temperature, top_p=a.top_p, max_tokens=a.max_tokens,
                     seed_per_request=a.seed_per_request, price_prompt_per_1k=a.price_prompt,
                     price_completion_per_1k=a.price_completion, progress=False if a.quiet else None)


def add_parsers(subparsers) -> None:
    """Add ``synth`` (``synth personas``) and ``judge`` to an argparse sub-parsers object."""
    from jaxembed.synth.personas import FAMILY_NAMES

    s = subparsers.add_parser("synth", help="synthetic training data from an LLM (KaLM persona-based synthesis)",
                              description="Generate training data with an OpenAI-compatible LLM endpoint.")
    sub = s.add_subparsers(dest="synth_command", required=True, metavar="{personas}")
    p = sub.add_parser("personas", help="persona-based synthetic data for six task families (KaLM 2.1)",
                       description="Sample personas, brainstorm task instructions per persona, generate examples "
                                   "per instruction, validate and deduplicate them, and write datasets with their "
                                   "instructions plus a data config. Rerunning resumes from the cache.")
    p.add_argument("--personas", required=True, metavar="FILE",
                   help="personas: .jsonl with a 'persona' field (Persona Hub), or .txt with one per line")
    p.add_argument("--persona-field", default="persona", help="JSON field of the persona text (default persona)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (rerun with the same one to resume)")
    p.add_argument("--num-personas", type=int, default=100, help="personas sampled (default 100)")
    p.add_argument("--instructions-per-persona", type=int, default=3,
                   help="task instructions brainstormed per persona and family (default 3)")
    p.add_argument("--examples-per-instruction", type=int, default=4, help="examples per instruction (default 4)")
    p.add_argument("--sts-examples-per-persona", type=int, default=4, help="STS triples per persona (default 4)")
    p.add_argument("--families", default=",".join(FAMILY_NAMES), metavar="F,F,...",
                   help=f"task families (default all: {', '.join(FAMILY_NAMES)})")
    p.add_argument("--language", default="English")
    p.add_argument("--seed", type=int, default=0, help="persona sampling and example parameters (default 0)")
    p.add_argument("--attempts", type=int, default=3,
                   help="answers asked per item before a malformed one is reported as rejected (default 3)")
    _llm_args(p, temperature=1.0, max_tokens=2048)
    p.set_defaults(func=cmd_personas)

    j = subparsers.add_parser("judge", help="LLM false-negative judge for mined hard negatives (PEG)",
                              description="Ask an LLM whether each hard negative answers its query; drop the ones it "
                                          "accepts. Rerunning resumes from the cache.")
    j.add_argument("--input", required=True, metavar="FILE", help="mined triplets (.jsonl: query, pos, neg)")
    j.add_argument("--out", required=True, metavar="FILE", help="filtered triplets (.jsonl)")
    j.add_argument("--query-field", default="query")
    j.add_argument("--pos-field", default="pos")
    j.add_argument("--neg-field", default="neg")
    j.add_argument("--with-positive", action="store_true", help="show the first positive as a reference answer")
    j.add_argument("--on-undecided", default="keep", choices=["keep", "drop"],
                   help="a negative whose verdict stays malformed after --attempts (default keep)")
    j.add_argument("--attempts", type=int, default=3)
    j.add_argument("--drop-empty", action="store_true", help="remove records left with no negative")
    j.add_argument("--report", default="", metavar="FILE", help="report JSON (default OUT.report.json)")
    _llm_args(j, temperature=0.0, max_tokens=32)
    j.set_defaults(func=cmd_judge)


def cmd_personas(a) -> int:
    from jaxembed.synth.personas import PersonaJobConfig, format_report, run_persona_job

    cfg = PersonaJobConfig(personas=a.personas, out=a.out, persona_field=a.persona_field,
                           num_personas=a.num_personas, instructions_per_persona=a.instructions_per_persona,
                           examples_per_instruction=a.examples_per_instruction,
                           sts_examples_per_persona=a.sts_examples_per_persona,
                           families=tuple(x.strip() for x in a.families.split(",") if x.strip()),
                           language=a.language, seed=a.seed, attempts=a.attempts, cache=a.cache)
    report = run_persona_job(cfg, _llm_config(a))
    print(format_report(report))
    o = report["outputs"]
    print(f"datasets: {o['data']}\ndata config: {o['data_config']} (jaxembed data prepare --config "
          f"{o['data_config']} --out STORE)\nreport: {o['report']}; rejected answers: {o['rejected']}; "
          f"answers cache: {report['cache']['file']}")
    return 0


def cmd_judge(a) -> int:
    from jaxembed.synth.judge import JudgeConfig, format_report, run_judge

    cfg = JudgeConfig(input=a.input, out=a.out, query_field=a.query_field, pos_field=a.pos_field,
                      neg_field=a.neg_field, with_positive=a.with_positive, on_undecided=a.on_undecided,
                      attempts=a.attempts, drop_empty=a.drop_empty, cache=a.cache, report=a.report)
    report = run_judge(cfg, _llm_config(a))
    print(format_report(report))
    o = report["outputs"]
    print(f"filtered: {o['out']}\ndropped negatives: {o['dropped']}\nreport: {o['report']}; answers cache: "
          f"{o['cache']}")
    return 0
