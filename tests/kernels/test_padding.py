"""Head padding: the per-call padder and the one-off pad_heads lay q out the same way."""

from __future__ import annotations

import pytest
import torch

from mlabench.kernels.padding import HeadPadder, pad_heads, padded_heads, slice_heads


def expected_layout(q: torch.Tensor, target: int, mode: str) -> torch.Tensor:
    """The layout written out row by row: head r % H (repeat) or zeros past H (zero)."""
    rows = [q[:, r % q.shape[1]] if mode == "repeat" or r < q.shape[1] else torch.zeros_like(q[:, 0])
            for r in range(target)]
    return torch.stack(rows, dim=1)


@pytest.mark.parametrize("heads,mode", [(12, "zero"), (12, "repeat"), (8, "repeat"), (20, "repeat"),
                                        (20, "zero"), (16, "repeat")])
def test_padder_layout_and_pad_heads_agree(heads, mode):
    q = torch.randn(3, heads, 576)
    target = padded_heads(heads)
    padder = HeadPadder(q, target, mode)
    first = padder()
    assert first.is_contiguous() and torch.equal(first, expected_layout(q, target, mode))
    q.mul_(2)  # the padder reads q anew on every call, into the same buffer
    again = padder()
    assert again is first and torch.equal(again, expected_layout(q, target, mode))
    assert torch.equal(pad_heads(q, target, mode), again)
    assert torch.equal(slice_heads(again, heads), q)


def test_pad_heads_without_padding_returns_q():
    q = torch.randn(2, 16, 576)
    assert pad_heads(q, 16, "repeat") is q


@pytest.mark.parametrize("target,mode,match", [(16, "mirror", "one of"), (8, "zero", "down to")])
def test_bad_padding_is_refused(target, mode, match):
    q = torch.randn(1, 12, 576)
    with pytest.raises(ValueError, match=match):
        HeadPadder(q, target, mode)
    with pytest.raises(ValueError, match=match):
        pad_heads(q, target, mode)


def test_padded_heads():
    assert [padded_heads(h) for h in (1, 12, 16, 17, 96)] == [16, 16, 16, 32, 96]
    with pytest.raises(ValueError):
        padded_heads(0)
