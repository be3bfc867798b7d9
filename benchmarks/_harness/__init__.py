"""What the benchmarks against sentence-transformers share (quality_parity.py, train_throughput.py): each script keeps
its own measurement (what it compares, its figures, its README line) and takes the rest from here.

- ``proc``: the process side: a timestamped log, this process's CPU seconds and memory, thread pinning, worker
  subprocesses (one-shot with a RESULT line, or long-lived with a line protocol), the device, the command line.
- ``recipe``: the run configs: a recipe file, the natural-length setting and its store, the loader's texts of a plan.
- ``models``: the model folders (MiniLM, random-weight BERT-base / Qwen2-0.5B), synthetic token ids.
- ``steps``: each tool's train step as a throughput worker runs it (fixed lengths, natural lengths), its FLOPs.
- ``st``: the sentence-transformers peer: the HF Trainer's AdamW groups, jaxembed's masked loss, the plan's rows.
- ``st_train``: the two sentence-transformers training runs of the quality comparison (matched, stock).
- ``scoring``: evaluation of a trained model, and scores over seeds (averages, spreads, paired differences).
- ``ablation``: the quality comparison's ablation arms against the baseline and their references, as README phrases
  and a markdown table.
- ``natural_figures``: the throughput comparison's natural-length figures (per-tool step, CPU time, memory) and the
  paired ratios between the tools.

Results and README lines: ``benchmarks/_record.py``. Nothing here imports a framework at module level: a worker
process imports what its tool needs.
"""
