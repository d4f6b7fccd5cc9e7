"""Switching on a real GPU (skipped without CUDA): pinned host buffers reused, device
memory returned at sleep, every value back at wake."""

from __future__ import annotations

import pytest
import torch

from rollmux.sdk.state import RoleState

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def trained_on_gpu() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4)).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 256, device="cuda")).sum().backward()
    optimizer.step()
    return model, optimizer


def test_a_sleeping_role_leaves_no_device_memory_and_wakes_with_every_value():
    model, optimizer = trained_on_gpu()
    expected = [t.detach().clone() for t in [*model.parameters(), *(p.grad for p in model.parameters())]]
    state = RoleState(model, optimizer, device="cuda")
    before = torch.cuda.memory_allocated()
    state.sleep()
    assert torch.cuda.memory_allocated() < before // 10
    assert all(p.is_pinned() for p in model.parameters())
    state.wake()
    got = [*model.parameters(), *(p.grad for p in model.parameters())]
    assert all(t.is_cuda for t in got)
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


def test_pinned_buffers_are_reused_across_switches():
    model, optimizer = trained_on_gpu()
    state = RoleState(model, optimizer, device="cuda")
    state.sleep()
    first = sorted(p.data_ptr() for p in model.parameters())
    state.wake()
    state.sleep()
    assert sorted(p.data_ptr() for p in model.parameters()) == first
