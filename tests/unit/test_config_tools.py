"""``[tools.<name>]`` tables and ``VOICEGATE_TOOL_<NAME>_<KEY>`` variables (config/tools.py), as
docs/configuration.md's tools table documents them."""

from __future__ import annotations

from pathlib import Path

import pytest

from config import ConfigError, load_settings
from config.reference import render_tools_reference
from config.tools import KEY_DOCS


def _tools(environ: dict[str, str]) -> dict[str, object]:
    return {tool.name: tool for tool in load_settings(environ=environ).tools}


def test_the_built_in_charge_tool_and_its_defaults() -> None:
    charge = _tools({})["charge"]
    assert (charge.kind, charge.approval, charge.approval_valid_s) == ("write", "caller", 300.0)  # type: ignore[attr-defined]


def test_a_variable_sets_a_key_and_declares_a_tool() -> None:
    tools = _tools(
        {
            "VOICEGATE_TOOL_CHARGE_APPROVAL_VALID_S": "45",
            "VOICEGATE_TOOL_BOOK_KIND": "write",
            "VOICEGATE_TOOL_BOOK_ENDPOINT": "http://127.0.0.1:9/book",
            "VOICEGATE_TOOL_BOOK_STATUS_ENDPOINT": "http://127.0.0.1:9/book/{key}",
            "VOICEGATE_TOOL_BOOK_APPROVAL": "dtmf",
        }
    )
    assert tools["charge"].approval_valid_s == 45.0  # type: ignore[attr-defined]
    book = tools["book"]
    assert (book.approval, book.approval_valid_s) == ("dtmf", 300.0)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"VOICEGATE_TOOL_CHARGE_APPROVAL_VALID_S": "0"}, "approval_valid_s = '0'.*1 to 86400"),
        ({"VOICEGATE_TOOL_CHARGE_APPROVAL_VALID_S": "soon"}, "approval_valid_s.*number"),
        ({"VOICEGATE_TOOL_CHARGE_APPROVALVALID": "1"}, "APPROVAL_VALID_S"),
    ],
)
def test_a_bad_tool_key_is_refused_naming_it(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(environ=environ)


def test_a_bad_key_in_the_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "voicegate.toml"
    path.write_text('[tools.charge]\napproval_valid_s = "later"\n')
    with pytest.raises(ConfigError, match=r"tools\.charge\.approval_valid_s"):
        load_settings(str(path), environ={})


def test_the_reference_lists_every_tool_key_and_its_variable() -> None:
    table = render_tools_reference()
    for key in KEY_DOCS:
        assert f"`tools.<name>.{key}`" in table
        assert f"`VOICEGATE_TOOL_<NAME>_{key.upper()}`" in table
