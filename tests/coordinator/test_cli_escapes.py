"""The CLI prints other parties' words escaped (issue 33): a provider registers an offer
whose device name carries Rich markup, ESC sequences, a newline and a bidi override (the
coordinator checks that a GPU name is printable, not the device's); an owner's
``aitbc market offers`` shows them as escapes and literal brackets, and writes no control
character to the terminal. (``ipfs ls`` names: tests/storage/test_cli_folders.py.)"""

from __future__ import annotations

import pytest

from aitbc.cli.common import others, shown, shown_name

DEVICE = "[red]RTX[/red][link=http://evil]\x1b[2J\x1b[Hfake\nline\u202e"


def test_a_providers_names_are_printed_escaped(fresh_server, aitbc, monkeypatch):
    monkeypatch.setenv("AITBC_COORDINATOR", fresh_server.url)
    monkeypatch.setenv("COLUMNS", "400")  # every column shown
    monkeypatch.delenv("AITBC_CA_CERT", raising=False)
    evil = fresh_server.client("evil")
    evil.post("/workers", {"gpu": "RTX4090", "price": "1.0", "availability": 0.99, "device": {"name": DEVICE}})
    r = aitbc("market", "offers")
    assert r.returncode == 0, r.stderr
    assert not {"\x1b", "\x07", "\u202e"} & set(r.stdout)
    assert r"[red]RTX[/red][link=http://evil]\x1b[2J\x1b[Hfake\nline\u202e" in r.stdout  # no markup read
    assert fresh_server.client("owner").get("/market/offers")["data"][0]["device"]["name"] == DEVICE  # kept as sent


@pytest.mark.parametrize(
    "text, expected",
    [
        ("plain é 日本語 and spaces", "plain é 日本語 and spaces"),
        ("\x1b[31mred\x07", r"\x1b[31mred\x07"),
        ("a\nb\tc\rd\x08", r"a\nb\tc\rd\x08"),
        ("bidi\u202eevil\u200b", r"bidi\u202eevil\u200b"),
        ("\x7f\x9b", r"\x7f\x9b"),  # DEL and the 8-bit CSI
    ],
)
def test_shown_escapes_what_a_terminal_would_act_on(text, expected):
    assert shown(text) == expected
    assert shown(text).isprintable()


def test_a_name_with_an_escape_reads_apart_from_one_spelled_out():
    assert shown_name("notes.txt") == "notes.txt"
    assert shown_name("a\x1bb") == r"'a\x1bb'"
    assert shown_name(r"a\x1bb") == r"'a\\x1bb'"  # the letters, not the character
    assert shown_name("'quoted'") == "\"'quoted'\""
    assert others("[bold]x[/bold]\x1b").plain == r"[bold]x[/bold]\x1b"  # a Text: no markup read
