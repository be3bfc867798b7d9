"""The task types a dataset may have and KaLM's instruction template: the names the data config, the record
parsers (``jaxembed.data.parsers``) and the record-format table (``jaxembed.data.formats``) share. It
imports nothing, so every module of ``jaxembed.data`` can read it."""

TASK_TYPES = ("retrieval", "reranking", "sts", "pair_classification", "classification", "clustering", "nli")
SYMMETRIC_TASK_TYPES = ("sts", "pair_classification", "nli")  # KaLM Table 1: no instruction (NLI counts as STS)

#: KaLM's instruction template (Table 1): ``Instruct: {task description} \n Query: {query}``.
KALM_TEMPLATE = "Instruct: {} \n Query: "
