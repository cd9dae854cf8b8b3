"""The private torch, Textual and plotext APIs ampscope reads, each checked against the
installed release: after an upgrade, the test that fails names the API that moved."""

from __future__ import annotations

import math

import pytest
import torch

from ampscope.engine import private_apis as torch_private
from ampscope.tui import private_apis as ui_private

pytestmark = pytest.mark.unit


def test_the_scalers_live_scale_is_the_tensor_get_scale_reads() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    assert torch_private.live_scale(scaler) is None  # before its first scale()
    assert torch_private.initial_scale(scaler) == 1024.0
    scaler.scale(torch.ones(()))
    live = torch_private.live_scale(scaler)
    assert isinstance(live, torch.Tensor) and live.item() == scaler.get_scale() == 1024.0
    off = torch.amp.GradScaler("cpu", enabled=False)
    assert torch_private.live_scale(off) is None and math.isnan(torch_private.initial_scale(off))


def test_dynamos_counters_are_the_mapping_the_compile_events_read() -> None:
    counters = torch_private.dynamo_counters()
    from torch._dynamo.utils import counters as dynamos

    assert counters is dynamos
    for table in ("frames", "stats", "graph_break", "inductor"):
        assert isinstance(counters[table].get("total", 0), int)


def test_a_dispatch_mode_sees_every_aten_op() -> None:
    seen = []

    class Seen(torch_private.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Seen():
        torch.ones(2, 3) @ torch.ones(3, 4)
    assert torch.ops.aten.mm.default in seen


def test_textual_names_the_key_a_character_types() -> None:
    assert ui_private.character_to_key("?") == "question_mark"
    assert ui_private.character_to_key("a") == "a"


def test_a_select_is_made_of_the_value_shown_and_the_pop_up_list() -> None:
    from textual.widgets import OptionList, Select
    from textual.widgets._select import NonSelectableStatic, SelectCurrent, SelectOverlay

    assert ui_private.SelectCurrent is SelectCurrent and ui_private.SelectOverlay is SelectOverlay
    assert ui_private.NonSelectableStatic is NonSelectableStatic
    assert issubclass(SelectOverlay, OptionList)
    assert {"SelectCurrent", "SelectOverlay"} <= set(Select.compose.__code__.co_names)
    assert "NonSelectableStatic" in SelectCurrent.compose.__code__.co_names
    assert callable(SelectCurrent.update)  # finds the value's part by its id, "label"
    # what ampscope.tui.widgets.drop_down.DropDown builds in its own time
    assert callable(Select._setup_options_renderables) and callable(Select._watch_value)


def test_a_widget_styled_as_a_child_is_given_a_parent_without_being_mounted() -> None:
    from textual.dom import DOMNode

    parent, child = DOMNode(), DOMNode()
    child._attach(parent)  # what ui_private.styled_as_child does before styling it
    assert child.parent is parent and child not in parent.children


def test_a_widgets_default_css_is_what_its_first_mounting_adds_to_the_stylesheet() -> None:
    from textual.widgets._select import SelectCurrent

    sources = SelectCurrent("")._get_default_css()  # what ui_private.with_default_css adds
    assert any("SelectCurrent {" in css for _where, css, _tie, _scope in sources)
    assert callable(ui_private.with_default_css)


def test_plotexts_glyph_tables_hold_a_glyph_for_every_cell_pattern() -> None:
    assert len(ui_private.braille_codes) >= 2**8 - 1
    assert len(ui_private.hd_codes) >= 2**4 - 1


def test_scaled_mm_is_the_fp8_gemm_with_its_scales_applied() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(32, 16, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(32, 16, generator=g).to(torch.float8_e4m3fn).t()  # column-major
    one, rows, cols = torch.ones(()), torch.full((32, 1), 2.0), torch.full((1, 32), 0.5)
    exact = a.float() @ b.float()
    torch.testing.assert_close(
        torch_private.scaled_mm(a, b, one, one, False).float(), exact, rtol=1e-2, atol=1e-2
    )
    torch.testing.assert_close(
        torch_private.scaled_mm(a, b, rows, cols, True).float(), exact, rtol=1e-2, atol=1e-2
    )


def test_torchaos_auto_filter_is_its_shape_rule() -> None:
    pytest.importorskip("torchao")
    keep = torch_private.torchao_auto_filter("rowwise")
    with torch.device("meta"):
        assert keep(torch.nn.Linear(8192, 8192), "fc") and not keep(
            torch.nn.Linear(1024, 8192), "fc"
        )
        assert not keep(torch.nn.Linear(4096, 2048), "fc")  # N <= 2048
