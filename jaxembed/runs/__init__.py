"""The run machinery every job that owns a run directory shares (``jaxembed train``, ``jaxembed pretrain retromae``):

- ``rundir``: ``RunDir``, the run directory's layout, declared once (each file and folder, who writes it, how);
- ``checkpoints``: Orbax checkpoints of the train state; ``monitor``: stdout, metrics.jsonl, TensorBoard, W&B, the
  progress bar; ``signals``: SIGTERM / SIGINT, a checkpoint then a clean stop; ``optim``: AdamW and its MoTE /
  freezing rules; ``workdir_lock``: one run per run directory; ``compile_cache``: the run's compiled programs.
- ``facts``: the run's facts its model card states (dev evaluations, summary facts);
- ``atomic_files``: files and folders written whole (a temporary name, then a rename), for every command;
  ``outputs``: a command's output paths checked before any work.

Nothing here imports ``jaxembed.train`` or ``jaxembed.pretrain``: both import this package. Importing the package
imports none of its modules.
"""
