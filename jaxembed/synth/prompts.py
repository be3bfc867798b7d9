"""What the persona job asks the LLM, and which answers it accepts (KaLM-Embedding 2.1, after Wang et al. 2024a,
"Improving Text Embeddings with Large Language Models"): the six task families (``FAMILIES``: brainstorm prompt,
example prompt, the answer's keys, the parameters sampled per example), the chat messages built from them, and
the validators of the answers (``ask_json`` asks again on a rejected answer). The job is
``jaxembed.synth.personas``."""

from __future__ import annotations

import dataclasses
import random
import unicodedata
from collections import Counter
from typing import Any

from jaxembed.synth.client import AnswerError

_JSON_ONLY = ("Your output must always be a JSON object only, do not explain yourself or output anything else. "
              "Be creative!")



@dataclasses.dataclass(frozen=True)
class Family:
    """A task family: the brainstorm prompt (None: no instructions), the example prompt, the answer's keys as
    (query, positive, negative) and the parameters sampled for each example."""

    name: str
    title: str
    task_type: str
    brainstorm: str | None
    example: str
    keys: tuple[str, str, str]
    params: tuple[tuple[str, tuple[str, ...]], ...]



_BRAINSTORM = """Brainstorm a list of potentially useful {what}.
Here are a few examples for your reference:
{examples}
Please adhere to the following guidelines:
{guidelines}- Each task should cover a wide range of inputs, and should not be too specific.
- Write each task as one sentence in {language} that starts with a verb or "Given", e.g. "Given a ..., retrieve ...".
Your output must be a JSON list of {n} strings only, each string a distinct task. Do not explain yourself or \
output anything else. Be creative!"""


_DOC_PARAMS = (("query_type", ("extremely long-tail", "long-tail", "common")),
               ("query_length", ("less than 5 words", "5 to 15 words", "at least 10 words")),
               ("clarity", ("clear", "understandable with some effort", "ambiguous")),
               ("num_words", ("50", "100", "200", "300")),
               ("difficulty", ("high school", "college", "PhD")))


FAMILIES: dict[str, Family] = {
    "short_long": Family(
        "short_long", "short-long retrieval", "retrieval",
        _BRAINSTORM.replace("{what}", "text retrieval tasks").replace("{examples}", (
            "- Provided a scientific claim as query, retrieve documents that help verify or refute the claim.\n"
            "- Search for documents that answer a FAQ-style query on children's nutrition.")).replace(
            "{guidelines}", "- Specify what the query is, and what the desired documents are.\n"),
        """You have been assigned a retrieval task: {task}
Your mission is to write one text retrieval example for this task in JSON format. The JSON object must contain \
the following keys:
- "user_query": a string, a random user search query specified by the retrieval task.
- "positive_document": a string, a relevant document for the user query.
- "hard_negative_document": a string, a hard negative document that only appears relevant to the query.
Please adhere to the following guidelines:
- The "user_query" should be {query_type}, {query_length}, {clarity}, and diverse in topic.
- All documents must be created independent of the query. Avoid copying the query verbatim. It's acceptable if \
some parts of the "positive_document" are not topically related to the query.
- All documents should be at least {num_words} words long.
- The "hard_negative_document" contains some useful information, but it should be less useful or comprehensive \
compared to the "positive_document".
- Both the query and documents should be in {language}.
- Do not provide any explanation in any document on why it is relevant or not relevant to the query.
- Both the query and documents require {difficulty} level education to understand.
""" + _JSON_ONLY,
        ("user_query", "positive_document", "hard_negative_document"), _DOC_PARAMS),
    "long_short": Family(
        "long_short", "long-short retrieval", "retrieval",
        _BRAINSTORM.replace("{what}", "text matching tasks where the query is a long text and the matching "
                                      "text is short (a title, a headline, a summary sentence, a keyword list)")
        .replace("{examples}", (
            "- Given a news article, retrieve its headline.\n"
            "- Given a product review, retrieve the one-sentence summary of the reviewer's complaint.")).replace(
            "{guidelines}", "- Specify what the long input is, and what the desired short text is.\n"),
        """You have been assigned a text matching task: {task}
Your mission is to write one example for this task in JSON format. The JSON object must contain the following keys:
- "input_text": a string, a long input text specified by the task.
- "positive_short_text": a string, the short text that matches the input.
- "hard_negative_short_text": a string, a short text that looks like a match but is wrong or less fitting.
Please adhere to the following guidelines:
- The "input_text" should be about {num_words} words long, {clarity}, and diverse in topic.
- The short texts should be {short_length}.
- Avoid copying sentences of the "input_text" into the short texts verbatim.
- All texts should be in {language} and require {difficulty} level education to understand.
""" + _JSON_ONLY,
        ("input_text", "positive_short_text", "hard_negative_short_text"),
        (("num_words", ("100", "200", "300")), ("clarity", ("clear", "understandable with some effort")),
         ("short_length", ("less than 10 words", "one sentence", "a short phrase")),
         ("difficulty", ("high school", "college", "PhD")))),
    "short_short": Family(
        "short_short", "short-short matching", "retrieval",
        _BRAINSTORM.replace("{what}", "text matching tasks where both the queries and the documents are "
                                      "extremely short (less than 10 words)").replace("{examples}", (
            "- Given a city name, retrieve the name of the country it is in.\n"
            "- Given a product name, retrieve its typical product category.")).replace(
            "{guidelines}", "- Specify what the query is, and what the desired documents are.\n"),
        """You have been assigned a text matching task: {task}
Your mission is to write one example for this task in JSON format. The JSON object must contain the following keys:
- "input": a string, a random input specified by the task.
- "positive_document": a string, a relevant document for the "input" according to the task.
- "hard_negative_document": a string, a document that looks relevant but does not match according to the task.
Please adhere to the following guidelines:
- All values must be extremely short, less than 10 words.
- The values should be {clarity} and in {language}.
- The "input" and documents require {difficulty} level education to understand.
""" + _JSON_ONLY,
        ("input", "positive_document", "hard_negative_document"),
        (("clarity", ("clear", "understandable with some effort")),
         ("difficulty", ("elementary school", "high school", "college")))),
    "long_long": Family(
        "long_long", "long-long matching", "retrieval",
        _BRAINSTORM.replace("{what}", "text matching tasks where both the queries and the documents are long "
                                      "passages").replace("{examples}", (
            "- Given a research paper abstract, retrieve abstracts of papers that build on its findings.\n"
            "- Given a legal case summary, retrieve summaries of precedent cases.")).replace(
            "{guidelines}", "- Specify what the query document is, and what the desired documents are.\n"),
        """You have been assigned a text matching task: {task}
Your mission is to write one example for this task in JSON format. The JSON object must contain the following keys:
- "input": a string, a long query document specified by the task.
- "positive_document": a string, a long document that matches the "input" according to the task.
- "hard_negative_document": a string, a long document on a similar topic that does not match according to the \
task.
Please adhere to the following guidelines:
- Every value should be at least {num_words} words long, {clarity}, and in {language}.
- Avoid copying sentences between the "input" and the documents.
- All texts require {difficulty} level education to understand.
""" + _JSON_ONLY,
        ("input", "positive_document", "hard_negative_document"),
        (("num_words", ("100", "200", "300")), ("clarity", ("clear", "understandable with some effort")),
         ("difficulty", ("high school", "college", "PhD")))),
    "classification": Family(
        "classification", "classification", "classification",
        _BRAINSTORM.replace("{what}", "text classification tasks").replace("{examples}", (
            "- Classify the sentiment of a restaurant review as positive, negative or mixed.\n"
            "- Identify the main topic of a customer support ticket.")).replace(
            "{guidelines}", "- Specify what the input text is and what the labels are.\n"),
        """You have been assigned a text classification task: {task}
Your mission is to write one text classification example for this task in JSON format. The JSON object must \
contain the following keys:
- "input_text": a string, the input text specified by the classification task.
- "label": a string, the correct label of the input text.
- "misleading_label": a string, a valid label for the given task, but not as appropriate as the "label" for the \
"input_text".
Please adhere to the following guidelines:
- The "input_text" should be {num_words} words and diverse in expression.
- Avoid including the values of the "label" and "misleading_label" fields in the "input_text", that would make \
the task too easy.
- The values for all fields should be in {language}.
- The "input_text" is {clarity} and requires {difficulty} level education to comprehend.
""" + _JSON_ONLY,
        ("input_text", "label", "misleading_label"),
        (("num_words", ("less than 10", "at least 10", "at least 50", "at least 100")),
         ("clarity", ("clear", "understandable with some effort", "ambiguous")),
         ("difficulty", ("high school", "college", "PhD")))),
    "sts": Family(
        "sts", "semantic textual similarity", "sts", None,
        """Write a {unit} triple with varying semantic similarity scores in JSON format. The semantic similarity \
score ranges from 1 to 5, with 1 denotes least similar and 5 denotes most similar. The JSON object must contain \
the following keys:
- "S1": a string, the reference {unit}.
- "S2": a string, a {unit} whose similarity score to S1 is {high_score}.
- "S3": a string, a {unit} whose similarity score to S1 is {low_score}.
Please adhere to the following guidelines:
- The values are all strings in {language}, do not add any other keys.
- There should be some word overlaps between all three strings.
- The strings should be diverse in topic and length, and draw on what you know and care about.
- The strings should require {difficulty} level education to understand.
""" + _JSON_ONLY,
        ("S1", "S2", "S3"),
        (("unit", ("sentence", "phrase", "passage")), ("high_score", ("4", "4.5", "5")),
         ("low_score", ("2.5", "3", "3.5")), ("difficulty", ("elementary school", "high school", "college")))),
}

FAMILY_NAMES = tuple(FAMILIES)



def normalize(text: str) -> str:
    """The text compared for exact deduplication: NFKC, case-folded, whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())



def persona_system_prompt(persona: str) -> str:
    return (f"You are the following persona: {persona}\n"
            "Think as this person would, drawing on their knowledge, work, needs and interests.")



def brainstorm_messages(family: Family, persona: str, n: int, language: str) -> list[dict]:
    return [{"role": "system", "content": persona_system_prompt(persona)},
            {"role": "user", "content": family.brainstorm.replace("{n}", str(n)).replace("{language}", language)}]



def sample_params(family: Family, rng: random.Random) -> dict[str, str]:
    return {k: rng.choice(v) for k, v in family.params}



def example_messages(family: Family, task: str | None, params: dict, language: str,
                     persona: str | None = None) -> list[dict]:
    text = family.example
    for k, v in {**params, "language": language, "task": task or ""}.items():  # the LLM's task text last
        text = text.replace("{" + k + "}", v)
    msgs = [{"role": "user", "content": text}]
    if persona is not None:
        msgs.insert(0, {"role": "system", "content": persona_system_prompt(persona)})
    return msgs



def validate_instructions(n: int, max_chars: int = 500):
    """A validator of a brainstorm answer: a JSON list of non-empty strings -> (the first n, counts of
    items left out)."""

    def check(value: Any):
        if not isinstance(value, list):
            raise AnswerError("not a JSON list", type(value).__name__)
        good, dropped = [], Counter()
        for x in value:
            if not isinstance(x, str):
                dropped["instruction not a string"] += 1
            elif not x.strip():
                dropped["empty instruction"] += 1
            elif len(x) > max_chars:
                dropped["instruction too long"] += 1
            else:
                good.append(" ".join(x.split()))
        if not good:
            raise AnswerError("no usable instruction in the list")
        if len(good) > n:
            dropped["more instructions than asked (ignored)"] += len(good) - n
        return good[:n], dropped

    return check



def validate_example(family: Family, max_chars: int):
    """A validator of an example answer: a JSON object with the family's three keys holding distinct, non-empty
    strings -> (query, positive, negative)."""

    def check(value: Any):
        if not isinstance(value, dict):
            raise AnswerError("not a JSON object", type(value).__name__)
        vals = []
        for k in family.keys:
            if k not in value:
                raise AnswerError(f"missing key '{k}'")
            v = value[k]
            if not isinstance(v, str):
                raise AnswerError(f"key '{k}' is not a string")
            if not v.strip():
                raise AnswerError(f"key '{k}' is empty")
            if len(v) > max_chars:
                raise AnswerError(f"key '{k}' is too long")
            vals.append(v.strip())
        q, p, n = (normalize(v) for v in vals)
        if p == n:
            raise AnswerError(f"'{family.keys[1]}' equals '{family.keys[2]}'")
        if q == p:
            raise AnswerError(f"'{family.keys[0]}' equals '{family.keys[1]}'")
        return tuple(vals)

    return check

