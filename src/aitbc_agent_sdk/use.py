"""Using a run's model on this machine: ``sample`` text from it and ``evaluate`` it on the
owner's own held-out data. Both fetch the run's model at a round (default the latest),
every blob re-hashed against its CID, rebuild it here (the library's own classes, never
code from the coordinator) and run it on the CPU. Registered in
:data:`~aitbc_agent_sdk.operations.OPERATIONS` like the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from aitbc.errors import UsageError
from aitbc.replies.base import Reply
from aitbc_agent_sdk.errors import InvalidArgument, NotFound
from aitbc_agent_sdk.operations import operation, resolve_run, run_detail
from aitbc_agent_sdk.protocol import AgentState, Offload, Op, Progress, ensure_error
from aitbc_agent_sdk.run_model import fetch_run_parts


class Sample(Reply):
    """A continuation of a prompt by a run's model."""

    training_id: str
    round: int | None = Field(description="the round whose model wrote it")
    cid: str = Field(description="that round's checkpoint")
    text: str = Field(description="the new text only (the prompt not repeated)")
    prompt_tokens: int = Field(description="tokens of the prompt")
    prompt_tokens_used: int = Field(description="of them, the last ones the model read (at most its context)")
    prompt_cut: bool = Field(description="the prompt was longer than the context and cut to its last tokens")
    new_tokens: int
    stopped: Literal["length", "end_of_text"] = Field(
        description="length: max_new_tokens reached; end_of_text: the model ended the text"
    )
    context: int = Field(description="tokens the model reads at once")
    temperature: float
    seed: int


class Evaluation(Reply):
    """A run's model on the owner's held-out data."""

    training_id: str
    round: int | None
    cid: str
    data_path: str
    loss: float = Field(description="mean cross-entropy: per predicted token (language), per sample (classifier)")
    perplexity: float | None = Field(description="exp(loss), language models; null for a classifier")
    accuracy: float | None = Field(description="share of samples classified right; null for a language model")
    samples: int = Field(description="windows of text (language) or samples (classifier) evaluated")
    tokens: int | None = Field(description="tokens predicted (bytes for the built-in transformer)")
    documents: int | None
    context: int | None = Field(description="tokens per window")


@operation
def sample(
    self: AgentState,
    training_id: str | None = None,
    prompt: str = "",
    *,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    seed: int = 0,
    round: int | None = None,
    progress: Progress | None = None,
) -> Op[Sample]:
    """Continue ``prompt`` with the run's model (``round``: that round's; default the
    latest), run here on the CPU: up to ``max_new_tokens`` (1..4096) tokens, each drawn
    from the model's distribution at ``temperature`` (0: the most likely token) with a
    generator seeded by ``seed`` (the same seed, the same text); it stops early when the
    model writes its end-of-text token. A prompt longer than the model's context is cut to
    its last ``context`` tokens (``prompt_cut`` says so). Language models only (an
    ``hf:...`` family, with the run's tokenizer; the built-in ``transformer``, in bytes); a
    classifier or code model is an :class:`InvalidArgument`, refused before anything is
    downloaded. Returns ``{training_id, round, cid, text, prompt_tokens,
    prompt_tokens_used, prompt_cut, new_tokens, stopped, context, temperature, seed}``."""
    from aitbc.training.use import SampleOptions, check_prompt, check_usable, load_run_model
    from aitbc.training.use import sample as run_sample

    try:
        opts = SampleOptions(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
        check_prompt(prompt)
    except UsageError as e:
        raise ensure_error(e) from None
    training_id = yield from resolve_run(self, training_id)
    run = yield from run_detail(training_id)
    try:
        check_usable(run.model_type, "sample")
    except UsageError as e:
        raise ensure_error(e) from None
    got = yield from fetch_run_parts(training_id, round, progress)
    rm = yield Offload(load_run_model, (got.parts,))
    out = yield Offload(run_sample, (rm, prompt, opts))
    return Sample(
        training_id=training_id,
        round=rm.round,
        cid=got.cid,
        text=out.text,
        prompt_tokens=out.prompt_tokens,
        prompt_tokens_used=out.prompt_tokens_used,
        prompt_cut=out.prompt_cut,
        new_tokens=out.new_tokens,
        stopped=out.stopped,
        context=out.context,
        temperature=float(temperature),
        seed=seed,
    )


@operation
def evaluate(
    self: AgentState,
    training_id: str | None = None,
    data_path: str | Path | None = None,
    *,
    text_field: str = "text",
    round: int | None = None,
    progress: Progress | None = None,
) -> Op[Evaluation]:
    """The run's model (``round``: that round's; default the latest) on the owner's own
    held-out data at ``data_path``, run here on the CPU. A language model reads text (a
    text file, ``.jsonl`` or ``.parquet`` with its text in ``text_field``, a folder of
    them, a ``datasets`` ``save_to_disk`` directory), tokenized as the run's data was (its
    tokenizer; bytes for the built-in ``transformer``) and cut into windows of its context:
    the mean loss per predicted token and its perplexity, exp(loss). A classifier reads
    labelled arrays (an ``.npz`` with ``x`` and ``y``, or ``digits``): mean loss and
    accuracy. The data is read before the model is downloaded, so a missing file or text
    field is refused first (:class:`NotFound`, :class:`InvalidArgument`). Returns
    ``{training_id, round, cid, data_path, loss, perplexity, accuracy, samples, tokens,
    documents, context}``."""
    from aitbc.training.use import evaluate as run_evaluate
    from aitbc.training.use import load_run_model, read_heldout

    if data_path is None or not str(data_path):
        raise InvalidArgument("bad_argument", "evaluate needs data_path=, the held-out data to evaluate on")
    if not text_field:
        raise InvalidArgument("bad_argument", "text_field must not be empty")
    path = str(data_path) if str(data_path) == "digits" else str(Path(data_path).expanduser())
    if path != "digits" and not Path(path).exists():
        raise NotFound("not_found", f"no such file or folder: {data_path}")
    training_id = yield from resolve_run(self, training_id)
    run = yield from run_detail(training_id)
    held = yield Offload(read_heldout, (run.model_type, path, text_field))
    got = yield from fetch_run_parts(training_id, round, progress)
    rm = yield Offload(load_run_model, (got.parts,))
    res = yield Offload(run_evaluate, (rm, held))
    return Evaluation(
        training_id=training_id,
        round=rm.round,
        cid=got.cid,
        data_path=str(data_path),
        loss=res.loss,
        perplexity=res.perplexity,
        accuracy=res.accuracy,
        samples=res.samples,
        tokens=res.tokens,
        documents=res.documents,
        context=res.context,
    )
