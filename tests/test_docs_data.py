"""docs/data.md's commands run as written: every ```bash block, in a scratch folder that is not the repository
(no ``configs/``: the recipes are found by name, the shared data by ``jaxembed.paths.shared_data_dir()``; the
commands that name ``../shared/data`` find it beside the folder), with jaxembed and python from this environment.
The block that trains is run up to `jaxembed train`, whose config is then validated instead (the training itself
is what tests/test_train_st.py covers)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_data_md_commands_run_as_written(shared_data, tmp_path):
    text = (ROOT / "docs" / "data.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert len(blocks) >= 4
    work = tmp_path / "repo"
    work.mkdir()
    (tmp_path / "shared").symlink_to(shared_data.parent)
    script = []
    for b in blocks:
        lines = b.replace("\\\n", " ").splitlines()  # a command continued with a backslash is one line
        train = [i for i, x in enumerate(lines) if x.startswith("jaxembed train ")]
        if train:  # everything before the training command, then a check of its config
            lines = lines[:train[0]] + [
                'python -c "from jaxembed import config as c; c.validate(c.load_config_file('
                '\'runs/st_example/config.py\')); print(\'config valid\')"']
        # a command marked skip needs what a scratch folder lacks (a pod, hours): test_docs.py checks it parses
        script += [x for x in lines if "doc-test: skip" not in x]
    # `data validate` exits 1 on the file with an empty positive, as the docs say: keep going, check its output
    body = "\n".join(x if "data validate" not in x else x.split("#")[0] + " || echo validate-exit-$?" for x in script)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=work, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "validate-exit-1" in out.stdout and "field 'positive': empty text" in out.stdout
    assert "wrote runs/st_example/fe_store: 8 datasets, 80 examples" in out.stdout
    assert "config valid" in out.stdout
    st = work / "runs" / "st_example"
    assert (st / "snli_triplets.parquet").is_file() and (st / "wikiqa_dev" / "qrels" / "dev.tsv").is_file()
