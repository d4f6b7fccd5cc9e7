"""RoleState: sleep/wake moves real tensors; the cold path restores from disk."""

from __future__ import annotations

import torch

from rollmux.runtime.state import RoleState


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()  # creates optimizer state tensors
    return model, optimizer


def snapshot(model, optimizer):
    params = [p.detach().clone() for p in model.parameters()]
    moments = [s["exp_avg"].clone() for s in optimizer.state.values()]
    return params, moments


def test_sleep_and_wake_keep_every_value_and_use_new_buffers():
    model, optimizer = model_and_optimizer()
    state = RoleState(model, optimizer, device="cpu")
    before = snapshot(model, optimizer)
    awake = [p.data for p in model.parameters()]  # held, so their memory is not reused
    state.sleep()
    assert not state.awake
    host = [p.data for p in model.parameters()]
    assert {t.data_ptr() for t in host}.isdisjoint(t.data_ptr() for t in awake)
    state.wake()
    assert {p.data_ptr() for p in model.parameters()}.isdisjoint(t.data_ptr() for t in host)
    after = snapshot(model, optimizer)
    for a, b in zip(before[0] + before[1], after[0] + after[1], strict=False):
        assert torch.equal(a, b)


def test_host_bytes_count_weights_and_optimizer_state():
    model, optimizer = model_and_optimizer()
    state = RoleState(model, optimizer, device="cpu")
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert state.host_bytes() == 3 * weights  # weights + Adam's two moments


def test_cold_restore_from_a_checkpoint(tmp_path):
    model, optimizer = model_and_optimizer()
    state = RoleState(model, optimizer, device="cpu")
    state.save(tmp_path / "ckpt.pt")
    expected = snapshot(model, optimizer)
    fresh_model, fresh_optimizer = model_and_optimizer()
    with torch.no_grad():
        for p in fresh_model.parameters():
            p.zero_()
    fresh = RoleState(fresh_model, fresh_optimizer, device="cpu")
    fresh.sleep()
    fresh.restore(tmp_path / "ckpt.pt")
    assert fresh.awake
    for a, b in zip(expected[0], snapshot(fresh_model, fresh_optimizer)[0], strict=False):
        assert torch.equal(a, b)
