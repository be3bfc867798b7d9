"""The names the command line and the run config accept for a model's runtime settings, declared once: argparse's
``choices`` (``jaxembed.cli``, ``evaluate.cli``, ``teacher.cli``, ``curriculum.cli``), the config checks
(``jaxembed.config``, ``jaxembed.pretrain.config``) and the modules that implement them (``jaxembed.pooling``,
``jaxembed.models.layers``, ``jaxembed.models.attention``) read these. It imports nothing, so the command line is
parsed without JAX."""

#: pooling modes (``jaxembed.pooling``; ``--pooling``, ``model.pooling``)
POOLING_MODES = ("mean", "cls", "lasttoken", "max", "mean_sqrt_len")

#: computation dtypes a model runs in (``jaxembed.models.layers.to_dtype``; ``--dtype``)
DTYPES = ("float32", "bfloat16", "float16")

#: the dtypes of a training run (``model.dtype``, ``model.param_dtype``) and of ``teacher-score``: no float16
TRAIN_DTYPES = tuple(d for d in DTYPES if d != "float16")

#: attention kernels (``jaxembed.models.attention``; ``--attention``, ``model.attention``)
ATTENTION_KERNELS = ("auto", "xla", "cudnn", "te", "pallas", "pallas_flash", "splash")
