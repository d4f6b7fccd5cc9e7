"""RoleState: sleep/wake moves real tensors; the cold path restores from disk."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from rollmux.dataplane.portable import PortableRole
from rollmux.sdk.state import RoleState, SleepMode, pinned_bytes


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
    steps = 4 * len(optimizer.state)  # Adam's step counter per parameter
    assert state.host_bytes() == 4 * weights + steps  # weights, gradients, Adam's two moments, counters


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


def test_every_optimizer_tensor_and_gradient_sleeps_and_the_optimizer_keeps_working():
    model, optimizer = model_and_optimizer()
    model(torch.randn(4, 8)).sum().backward()  # gradients present while it sleeps
    grads = [p.grad.clone() for p in model.parameters()]
    steps = [s["step"].clone() for s in optimizer.state.values()]
    state = RoleState(model, optimizer, device="cpu")
    tensors = {id(t) for t in state._tensors()}
    state.sleep()
    state.wake()
    assert {id(t) for t in state._tensors()} == tensors  # the same objects, re-pointed in place
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))
    assert all(torch.equal(a, s["step"]) for a, s in zip(steps, optimizer.state.values(), strict=True))
    reference, reference_optimizer = model_and_optimizer()
    reference(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    reference_optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters(), strict=True))


def test_host_buffers_are_allocated_once_and_reused():
    model, optimizer = model_and_optimizer()
    state = RoleState(model, optimizer, device="cpu")

    def host_addresses():
        moments = [t for s in optimizer.state.values() for t in (s["exp_avg"], s["exp_avg_sq"], s["step"])]
        grads = [p.grad for p in model.parameters()]
        return sorted(t.data_ptr() for t in [*model.parameters(), *grads, *moments])

    state.sleep()
    first = host_addresses()
    state.wake()
    state.sleep()
    assert host_addresses() == first


def test_tied_weights_stay_tied():
    embed = torch.nn.Embedding(5, 3)
    head = torch.nn.Linear(3, 5, bias=False)
    head.weight = embed.weight
    model = torch.nn.ModuleDict({"embed": embed, "head": head})
    state = RoleState(model, device="cpu")
    assert state.host_bytes() == 5 * 3 * 4  # one storage, counted once
    state.sleep()
    state.wake()
    with torch.no_grad():
        embed.weight[0, 0] = 7.0
    assert head.weight[0, 0].item() == 7.0


def test_a_discarded_role_keeps_nothing_and_needs_its_weights_again():
    model = torch.nn.Linear(8, 4)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    state = RoleState(model, device="cpu")
    state.sleep(SleepMode.DISCARD)
    assert state.needs_weights and state.host_bytes() == 0
    assert all(p.numel() == 0 for p in model.parameters())
    state.wake()
    assert model.weight.shape == (4, 8)
    model.load_state_dict(expected)
    state.weights_loaded()
    assert not state.needs_weights and torch.equal(model.weight, expected["weight"])


def test_a_role_with_optimizer_state_cannot_discard_it():
    model, optimizer = model_and_optimizer()
    state = RoleState(model, optimizer, device="cpu")
    with pytest.raises(ValueError, match="offload"):
        state.sleep(SleepMode.DISCARD)
    assert state.awake


def test_pinned_buffers_are_counted_as_the_allocator_rounds_them():
    assert [pinned_bytes(n) for n in (1, 4096, 4097, 3 * 2**20)] == [1, 4096, 8192, 4 * 2**20]


def test_a_sleeping_role_survives_pickling_as_a_move_does():
    model, optimizer = model_and_optimizer()
    state = RoleState(model, optimizer, device="cpu")
    before = snapshot(model, optimizer)
    state.sleep()
    moved = pickle.loads(pickle.dumps(state))
    moved.wake()
    after = snapshot(moved.module, moved.optimizer)
    assert all(torch.equal(a, b) for a, b in zip(before[0] + before[1], after[0] + after[1], strict=True))
    moved.sleep()
    moved.wake()
    assert all(torch.equal(a, b) for a, b in zip(before[0], snapshot(moved.module, moved.optimizer)[0], strict=True))


class Holder:
    """A role: tensors behind a RoleState, and a numpy buffer it keeps (a publisher's)."""

    def __init__(self):
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        model(torch.randn(4, 256)).sum().backward()
        optimizer.step()
        self.state = RoleState(model, optimizer, device="cpu")
        self.buffer = np.arange(1000, dtype=np.float32)
        self.state.also_holds(self.buffer)


def test_a_portable_role_ships_its_bytes_out_of_band_and_leaves_the_original_intact():
    role = Holder()
    before = snapshot(role.state.module, role.state.optimizer)
    role.state.sleep()
    out_of_band: list = []
    blob = pickle.dumps(PortableRole(role), protocol=5, buffer_callback=out_of_band.append)
    assert len(blob) < role.state.host_bytes() / 20  # the bytes are in the buffers, not the pickle
    assert sum(memoryview(b).nbytes for b in out_of_band) >= role.state.host_bytes()
    arrived = pickle.loads(blob, buffers=out_of_band)
    for copy in (role, arrived):
        copy.state.wake()
        after = snapshot(copy.state.module, copy.state.optimizer)
        assert all(torch.equal(a, b) for a, b in zip(before[0] + before[1], after[0] + after[1], strict=True))
    arrived.buffer[0] = 7.0  # its own, writable copy
    assert role.buffer[0] == 0.0 and arrived.state.host_bytes() == role.state.host_bytes()
    with pytest.raises(RuntimeError, match="only a sleeping role travels"):
        pickle.dumps(PortableRole(role))
