"""``jaxembed teacher-score``: argument parsing; the job is ``jaxembed.teacher.score_file`` (the format, the resume
and the scores are described there)::

    jaxembed teacher-score --model TEACHER --input train.jsonl --out train.scored.jsonl [--batch-size 64]
        [--prompt P | --prompt-name NAME] [--doc-prompt P | --doc-prompt-name NAME] [--max-length N] [--dtype D]
"""

from __future__ import annotations

from jaxembed.choices import TRAIN_DTYPES
from jaxembed.teacher import score_file


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "teacher-score", help="a teacher embedding model's pos_scores / neg_scores for a triplets file (distillation)",
        description="Score each query against its positives and negatives with a teacher bi-encoder (cosine) and "
                    "write the records with pos_scores / neg_scores, for loss.distill. Resumable: rerun the same "
                    "command after a stop.")
    p.add_argument("--model", required=True, help="teacher model folder (HF / sentence-transformers / jaxembed "
                                                  "export) or hub id")
    p.add_argument("--input", required=True, help="triplets, JSON Lines (query, pos [...], neg [...])")
    p.add_argument("--out", required=True, help="output JSON Lines: the records with pos_scores / neg_scores")
    p.add_argument("--batch-size", type=int, default=64, help="texts per forward pass (default 64)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--prompt", default=None, help="instruction prefixed to every query")
    g.add_argument("--prompt-name", default=None, help="a named prompt of the teacher for the queries")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--doc-prompt", default=None, help="instruction prefixed to every positive and negative")
    g.add_argument("--doc-prompt-name", default=None, help="a named prompt of the teacher for the documents")
    p.add_argument("--max-length", type=int, default=None, help="truncate texts to N tokens (default: the model's)")
    p.add_argument("--dtype", default="float32", choices=TRAIN_DTYPES, help="computation dtype")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_teacher_score)


def cmd_teacher_score(args) -> int:
    r = score_file(args.model, args.input, args.out, batch_size=args.batch_size, prompt=args.prompt,
                   prompt_name=args.prompt_name, doc_prompt=args.doc_prompt, doc_prompt_name=args.doc_prompt_name,
                   max_length=args.max_length, dtype=args.dtype, progress=not args.quiet)
    resumed = f", resumed after {r['resumed']} records" if r["resumed"] else ""
    print(f"wrote {r['out']}: {r['records']} records with pos_scores / neg_scores (teacher {args.model}, cosine) in "
          f"{r['seconds']:.1f}s{resumed}")
    return 0
