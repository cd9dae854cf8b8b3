"""A mistyped name is answered with the name meant ("Did you mean 'amp-bf16'?"), not only the
whole list: presets, fields, field values, formats and ``--model`` factories."""

from __future__ import annotations

from pathlib import Path

import pytest

from ampscope.core.formats.catalog import keys_from
from ampscope.core.presets import ConfigError, find_preset, load_preset
from ampscope.core.presets.suggest import closest
from ampscope.engine.workloads.user_code import UserCodeError, load_factory
from tests.helpers import cli

pytestmark = pytest.mark.unit


def test_a_preset_typo_names_the_preset_meant(capsys) -> None:
    said = cli(capsys, "run", "amp-bf61", "--no-record")
    assert said.returncode == 2
    assert "Unknown preset 'amp-bf61'. Did you mean 'amp-bf16'?" in said.stderr
    assert "Traceback" not in said.stderr
    with pytest.raises(ConfigError, match="Did you mean 'amp-fp16-noscale'"):
        find_preset("amp-fp16-nosacle")


def test_nothing_close_suggests_nothing() -> None:
    with pytest.raises(ConfigError) as caught:
        find_preset("zzzzzz")
    assert "Did you mean" not in str(caught.value)
    assert closest("zz", ["fp32", "bf16"]) is None


@pytest.mark.parametrize(
    ("override", "meant"),
    [
        ("precison='fp16'", "unknown field 'precison'. Did you mean 'precision'?"),
        ("workload.layerz=3", "unknown field 'workload.layerz'. Did you mean 'layers'?"),
        ("precision='bf61'", "invalid value 'bf61'. Did you mean 'bf16'?"),
        ("workload.kind='mpl'", "invalid value 'mpl'. Did you mean 'mlp'?"),
    ],
)
def test_a_field_or_value_typo_names_the_one_meant(override: str, meant: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_preset("amp-bf16", [override])
    assert meant in str(caught.value)


def test_a_format_typo_prefers_the_swapped_letters(capsys) -> None:
    with pytest.raises(KeyError, match="Did you mean 'fp16'"):
        keys_from("bf16,fp61")  # fp64 is as close to difflib; two swapped letters are likelier
    said = cli(capsys, "dtypes", "1.0", "--formats", "e4m3,bf61")
    assert said.returncode == 2 and "Did you mean 'bf16'?" in said.stderr
    said = cli(capsys, "dtypes", "--demo", "fp16-undreflow")
    assert said.returncode == 2 and "Did you mean 'fp16-underflow'?" in said.stderr


FACTORY_FILE = """
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)


def make_tiny(ctx):
    return {"model": TinyNet(), "batches": DataLoader([torch.zeros(4)])}


def _private_helper():
    return None
"""


def test_a_model_factory_typo_lists_only_the_files_own_functions(tmp_path: Path) -> None:
    path = tmp_path / "tinyvit.py"
    path.write_text(FACTORY_FILE)
    with pytest.raises(UserCodeError) as caught:
        load_factory(f"{path}:make_tinny")
    message = str(caught.value)
    assert f"{path} has no 'make_tinny'. Did you mean 'make_tiny'?" in message
    assert "The functions it defines: make_tiny." in message
    for imported in ("DataLoader", "Dataset", "TinyNet", "_private_helper"):
        assert imported not in message
