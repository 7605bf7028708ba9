"""Using a run's model on this machine: ``sample`` and ``evaluate`` (the SDK's
:meth:`~aitbc_agent_sdk.Agent.sample` and :meth:`~aitbc_agent_sdk.Agent.evaluate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aitbc.cli.common import DEFAULT_HOME, HomeOption, out, resolve_home
from aitbc.cli.progress import bars
from aitbc.cli.training.plumbing import CoordinatorOpt, JsonOpt, RunIdOpt, emit_json, fmt, run_agent, say

RoundOpt = Annotated[int | None, typer.Option("--round", help="A given round's model (default: the latest).")]


def sample(
    training_id: RunIdOpt,
    prompt: Annotated[str, typer.Option("--prompt", help="The text to continue (non-empty).", show_default=False)],
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", help="Tokens to write at most, 1 to 4096 (bytes for transformer).")
    ] = 64,
    temperature: Annotated[
        float, typer.Option("--temperature", help="Sampling temperature, 0 to 100 (0: the most likely token).")
    ] = 1.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the draws: the same seed, the same text.")] = 0,
    round: RoundOpt = None,
    coordinator: CoordinatorOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Continue a prompt with the run's model, run here on the CPU.

    Language models: hf:... with the run's tokenizer, transformer in bytes. A prompt longer
    than the model's context is cut to its last context tokens, and the output says so."""
    home = resolve_home(home)
    with run_agent(home, coordinator, training_id) as a, bars(json_out) as progress:
        res = a.sample(
            training_id,
            prompt,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            round=round,
            progress=progress,
        )
    if json_out:
        emit_json(res)
        return
    if res.prompt_cut:
        say(
            f"(the prompt is {res.prompt_tokens} tokens; the model read its last {res.prompt_tokens_used}, its context)"
        )
    out.print(prompt + res.text, highlight=False, markup=False)
    ended = "the model ended the text" if res.stopped == "end_of_text" else "max-new-tokens reached"
    say(f"({res.new_tokens} new tokens, round {res.round}; {ended})")


def evaluate(
    training_id: RunIdOpt,
    data_path: Annotated[
        Path,
        typer.Option(
            "--data-path",
            help="Held-out data: text (a file, .jsonl, .parquet, a folder of them, a saved dataset) for a "
            "language model; an .npz with x and y, or digits, for a classifier.",
            show_default=False,
        ),
    ],
    text_field: Annotated[
        str, typer.Option("--text-field", help="The text field of .jsonl/.parquet records.")
    ] = "text",
    round: RoundOpt = None,
    coordinator: CoordinatorOpt = None,
    json_out: JsonOpt = False,
    home: HomeOption = DEFAULT_HOME,
) -> None:
    """Loss and perplexity of the run's model on your own held-out data, run here on the CPU.

    Tokenized with the run's tokenizer (bytes for transformer). A classifier: loss and
    accuracy."""
    home = resolve_home(home)
    with run_agent(home, coordinator, training_id) as a, bars(json_out) as progress:
        res = a.evaluate(training_id, str(data_path), text_field=text_field, round=round, progress=progress)
    if json_out:
        emit_json(res)
        return
    if res.perplexity is not None or res.tokens is not None:
        say(
            f"loss {fmt(res.loss, '.4f')}, perplexity {fmt(res.perplexity, '.2f')} on {res.tokens:,} tokens "
            f"({res.documents} documents, {res.samples} windows of at most {res.context}; round {res.round})"
        )
    else:
        say(
            f"loss {fmt(res.loss, '.4f')}, accuracy {fmt(res.accuracy, '.4f')} on {res.samples:,} samples "
            f"(round {res.round})"
        )
