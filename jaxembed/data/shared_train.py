"""The data config of the shared public training data (``<data_dir>/train``: 14 datasets, 6 task types), written
in the schema of jaxembed.data.config: the data of the demo and of the four papers' recipes."""

from __future__ import annotations

from pathlib import Path

import ml_collections

from jaxembed.data.config import dataset_config, default_data_config
from jaxembed.data.task_types import KALM_TEMPLATE


def _kalm(task: str) -> str:
    return KALM_TEMPLATE.format(task)


SENTIMENT_2 = [("negative", "A text expressing a negative sentiment."),
               ("positive", "A text expressing a positive sentiment.")]


def shared_train_config(data_dir) -> ml_collections.ConfigDict:
    """The data config of every file in ``<data_dir>/train`` (the shared public data, see its README).

    ========================= ===================== ======================================================
    dataset                   task type             reading
    ========================= ===================== ======================================================
    snli, sick_nli            nli                   triplets (entailment = pos, contradiction = neg)
    sick_sts                  sts                   scored pairs, positive when relatedness >= 4.0 (of 1-5)
    stsb                      sts                   scored pairs, positive when similarity >= 4.0 (of 0-5)
    mrpc                      pair_classification   labelled pairs, label 1 (paraphrase) = positive
    wikiqa                    retrieval             triplets (answer sentences; natural hard negatives)
    trecqa                    reranking             triplets
    trec, sst2, sst5, mr,     classification        (text, label) -> (text, label description), the other
    cr, mpqa, subj                                  labels' descriptions as hard negatives (KaLM)
    ========================= ===================== ======================================================

    Thresholds: 4.0 of 5 is "mostly equivalent" on the STS-B scale (4 = "mostly equivalent, some unimportant
    details differ"); on SICK relatedness 4.0 keeps the clearly related pairs. Below it a pair is counted and
    skipped ("score below threshold"), never silently dropped.

    Instructions: KaLM style (``Instruct: ... \\n Query: ``) on the query of asymmetric tasks (retrieval,
    reranking, classification); none for symmetric ones (STS, pair classification, NLI).
    """
    d = Path(data_dir) / "train"

    def f(name):
        return str(d / name)

    sentiment = _kalm("Classify the sentiment expressed in the given movie review text.")
    datasets = [
        dataset_config(name="snli", path=f("snli_triplets.jsonl"), format="triplets", task="nli",
                       task_type="nli", query_instruction="", num_negatives=1),
        dataset_config(name="sick_nli", path=f("sick_triplets.jsonl"), format="triplets", task="nli",
                       task_type="nli", query_instruction="", num_negatives=1),
        dataset_config(name="sick_sts", path=f("sick_pairs.jsonl"), format="scored_pairs", task="sts",
                       task_type="sts", query_instruction="", num_negatives=0, score_threshold=4.0,
                       extra_fields=["entailment"]),
        dataset_config(name="stsb", path=f("stsb_pairs.jsonl"), format="scored_pairs", task="sts",
                       task_type="sts", query_instruction="", num_negatives=0, score_threshold=4.0),
        dataset_config(name="mrpc", path=f("mrpc_pairs.jsonl"), format="labelled_pairs", task="paraphrase",
                       task_type="pair_classification", query_instruction="", num_negatives=0),
        dataset_config(name="wikiqa", path=f("wikiqa.jsonl"), format="triplets", task="answer_retrieval",
                       task_type="retrieval", num_negatives=7,
                       query_instruction=_kalm("Given a question, retrieve Wikipedia sentences that answer it.")),
        dataset_config(name="trecqa", path=f("trecqa.jsonl"), format="triplets", task="answer_reranking",
                       task_type="reranking", num_negatives=7,
                       query_instruction=_kalm("Given a question, rerank news sentences by how well they "
                                               "answer it.")),
        dataset_config(name="trec", path=f("trec_cls.jsonl"), format="classification", task="question_type",
                       task_type="classification", num_negatives=5, extra_fields=["fine_label"],
                       query_instruction=_kalm("Classify the given question by the type of its answer."),
                       label_descriptions=[
                           ("abbreviation", "A question asking for an abbreviation or its expansion."),
                           ("description", "A question asking for a description, definition or reason."),
                           ("entity", "A question asking for an entity: a thing, an object, an animal."),
                           ("human", "A question asking for a person or a group of people."),
                           ("location", "A question asking for a place or location."),
                           ("numeric value", "A question asking for a number, date, amount or quantity."),
                       ]),
        dataset_config(name="sst2", path=f("sst2_cls.jsonl"), format="classification", task="sentiment",
                       task_type="classification", num_negatives=1, query_instruction=sentiment,
                       label_descriptions=SENTIMENT_2),
        dataset_config(name="sst5", path=f("sst5_cls.jsonl"), format="classification", task="sentiment_5",
                       task_type="classification", num_negatives=4,
                       query_instruction=_kalm("Classify the sentiment of the given movie review on a five-point "
                                               "scale."),
                       label_descriptions=[
                           ("very negative", "A very negative movie review."),
                           ("negative", "A negative movie review."),
                           ("neutral", "A neutral movie review."),
                           ("positive", "A positive movie review."),
                           ("very positive", "A very positive movie review."),
                       ]),
        dataset_config(name="mr", path=f("mr_cls.jsonl"), format="classification", task="sentiment",
                       task_type="classification", num_negatives=1, query_instruction=sentiment,
                       label_descriptions=SENTIMENT_2),
        dataset_config(name="cr", path=f("cr_cls.jsonl"), format="classification", task="product_sentiment",
                       task_type="classification", num_negatives=1,
                       query_instruction=_kalm("Classify the sentiment expressed in the given customer product "
                                               "review."),
                       label_descriptions=SENTIMENT_2),
        dataset_config(name="mpqa", path=f("mpqa_cls.jsonl"), format="classification", task="opinion_polarity",
                       task_type="classification", num_negatives=1,
                       query_instruction=_kalm("Classify the polarity of the given opinion phrase."),
                       label_descriptions=SENTIMENT_2),
        dataset_config(name="subj", path=f("subj_cls.jsonl"), format="classification", task="subjectivity",
                       task_type="classification", num_negatives=1,
                       query_instruction=_kalm("Classify the given movie text as a subjective opinion or an "
                                               "objective plot description."),
                       label_descriptions=[("objective", "An objective description of facts or plot."),
                                           ("subjective", "A subjective opinion or judgement.")]),
    ]
    cfg = default_data_config()
    cfg.datasets = datasets
    cfg.on_error = "stop"
    cfg.sampling = "temperature"
    cfg.sampling_temperature = 2.0  # flattens the size imbalance (SST-2 is 67k of the 124k examples)
    return cfg
