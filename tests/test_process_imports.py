"""A ``jaxembed`` process imports only what it uses: torch, which transformers' AutoTokenizer and tensorboardX's
writer import wherever it is installed (~2 CPU-s per process), is not imported by a run that loads a model folder
seen before (jaxembed/tokenizer_class.py) and writes TensorBoard events (jaxembed/runs/monitor.py)."""

from __future__ import annotations

import subprocess
import sys

from jaxembed import tokenizer_class

CODE = """
import sys
from jaxembed.tokenizer import Tokenizer
from jaxembed.runs.monitor import Monitor, summary_writer_class

Tokenizer.from_folder(sys.argv[1])
monitor = Monitor(sys.argv[2], total_steps=1, progress=False)
monitor.log(1, {"loss": 0.5})
monitor.close()
assert summary_writer_class().__module__ == "tensorboardX.writer"
print(sorted(m for m in ("torch", "transformers.models.auto.tokenization_auto") if m in sys.modules))
"""


def test_loading_a_seen_folder_and_writing_events_does_not_import_torch(minilm_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("JAXEMBED_CACHE", str(tmp_path / "cache"))
    from transformers.models.bert.tokenization_bert import BertTokenizer  # AutoTokenizer's class for MiniLM

    tokenizer_class.remember(tokenizer_class.folder_key(minilm_dir), BertTokenizer)  # as a first load would
    out = subprocess.run([sys.executable, "-c", CODE, str(minilm_dir), str(tmp_path)], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-1] == "[]", out.stderr[-3000:]
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
