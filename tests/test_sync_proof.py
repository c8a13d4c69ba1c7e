"""The weights' proof (grpo_lab.fingerprint): the fingerprint's lines and layout, then every sync fault of
tests/sync_faults.py on HFSampler and on the TRL route's in-process α, each caught with the
tensor named, and good syncs proved in a run."""

import re

import pytest
import torch
from sync_faults import FAULTS, nudge, pushed
from tiny_lm import EvenTokenTask, tiny_model, word_tokenizer

from grpo_lab import GRPOConfig, GRPOLoop
from grpo_lab.fingerprint import (
    BLOCK,
    COLUMNS,
    SAMPLES,
    column_block,
    crc,
    fingerprint,
    pick,
    prove,
    prove_local,
    sample_positions,
    served_elements,
)
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.sampling import HFSampler
from grpo_lab.sync_audit import SyncError


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer()


# ----------------------------------------------------------------------------- the fingerprint

def test_samples_are_fixed_per_sync_and_drawn_afresh_at_each():
    assert torch.equal(sample_positions(1000, 3, block=1), sample_positions(1000, 3, block=1))
    assert len(sample_positions(1000, 3, block=1)) == SAMPLES
    assert len(sample_positions(5000, 3)) == SAMPLES * BLOCK
    assert not torch.equal(sample_positions(1000, 3, block=1), sample_positions(1000, 4, block=1))
    assert torch.equal(sample_positions(7, 3), torch.arange(7))
    drawn = torch.cat([sample_positions(1000, k, block=1) for k in range(400)])
    assert drawn.min() == 0 and drawn.max() == 999 and len(set(drawn.tolist())) > 990  # uniform over the axis


def test_columns_are_one_aligned_block_drawn_afresh_at_each_sync():
    """One block of COLUMNS consecutive columns, aligned (inside one cache line of a float32 row), drawn uniformly
    over the blocks and afresh at each sync; a narrow matrix whole."""
    block = column_block(576, 3)
    assert block == column_block(576, 3) and block != column_block(576, 4)
    assert block.stop - block.start == COLUMNS and block.start % COLUMNS == 0
    assert column_block(3, 0) == slice(0, 3)
    assert {column_block(576, k).start for k in range(2000)} == set(range(0, 576, COLUMNS))


def test_fused_samples_are_the_parts_and_columns_are_a_products():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, 40, generator=g) for n in (64, 16, 16))
    fused = torch.cat([q, k, v])
    for step in range(5):
        assert torch.equal(pick([q, k, v], "elements", torch.float32, step),
                           pick([fused], "elements", torch.float32, step))
    columns = torch.arange(40)[column_block(40, 2)]
    one_hot = torch.zeros(len(columns), 40)
    one_hot[torch.arange(len(columns)), columns] = 1
    product = one_hot @ fused.to(torch.bfloat16).float().t()            # what an engine's kernel returns
    assert crc(product.to(torch.bfloat16).t()) == fingerprint([q, k, v], "columns", torch.bfloat16, 2)


def test_the_numpy_fast_path_reads_the_bytes_torch_reads():
    pieces = [torch.randn(500), torch.arange(300), torch.randn(0), torch.randn(40, 20).half(), torch.tensor(2.0),
              torch.rand(100) > 0.5, torch.randn(30, 30).to(torch.bfloat16), torch.randn(70, 3).t()]
    for step in range(3):
        for p in pieces:
            assert fingerprint([p], "elements", p.dtype, step) == crc(pick([p], "elements", p.dtype, step)), p.dtype


def test_the_raw_gather_reads_the_samples_pick_reads():
    """prove_local's one gather over raw addresses reads, for every tensor, the bytes of pick's samples."""
    from grpo_lab.fingerprint import BLOCK, _gather_blocks, block_starts

    tensors = [torch.randn(1000), torch.randn(64, 33), torch.randn(4099).half(), torch.randn(300, 7).to(torch.bfloat16)]
    for step in range(4):
        for size in (2, 4):
            group = [t for t in tensors if t.element_size() == size]
            starts = block_starts(torch.tensor([t.numel() for t in group]).numpy(), step, BLOCK) * size
            gathered = _gather_blocks(group, starts, BLOCK * size)
            for t, got in zip(group, gathered, strict=True):
                assert got.tobytes() == pick([t], "elements", t.dtype, step).view(torch.uint8).numpy().tobytes()


def test_prove_local_compares_the_samples_byte_for_byte():
    """A served tensor differing from π_θ's in one sampled element (the lowest bit) is caught and named; the
    first that differs in served order is the one named; a tensor of π_θ served nowhere is named."""
    g = torch.Generator().manual_seed(1)
    theta = {"a": torch.randn(40, 16, generator=g), "b": torch.randn(500, generator=g), "c": torch.randn(3)}
    served = {name: t.clone() for name, t in theta.items()}
    prove_local(list(served.items()), theta, step=2)
    for name in ("b", "a"):
        position = sample_positions(served[name].numel(), 2)[7]
        served[name].view(-1).view(torch.int32)[position] ^= 1                 # one bit of one sampled element
    with pytest.raises(SyncError, match=r"step 2 did not take: 'a' differs — the sampler serves fingerprint"):
        prove_local(list(served.items()), theta, step=2)
    with pytest.raises(SyncError, match=r"cannot be proved: π_θ's \['d'\]"):
        prove_local([(n, t) for n, t in theta.items()], {**theta, "d": theta["c"]}, step=2)


def testnamed_tensors_walks_as_named_parameters_then_named_buffers(tied_model_dir):
    from transformers import LlamaForCausalLM

    from grpo_lab.lm.sampling import named_tensors

    model = LlamaForCausalLM.from_pretrained(tied_model_dir)
    for remove in (True, False):
        expected = [*model.named_parameters(remove_duplicate=remove), *model.named_buffers(remove_duplicate=remove)]
        got = named_tensors(model, remove_duplicate=remove)
        assert [n for n, _ in got] == [n for n, _ in expected]
        assert all(a is b for (_, a), (_, b) in zip(got, expected, strict=True))
    assert len(named_tensors(model, False)) == len(named_tensors(model, True)) + 1   # the tied head


def test_a_cast_a_tied_head_and_a_missing_tensor():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(50, 8, generator=g)
    served = served_elements([("a.weight", w.to(torch.bfloat16)), ("lm_head.weight", w.to(torch.bfloat16))], 3)
    prove(served, {"a.weight": w, "lm_head.weight": w}, step=3)          # bf16 of fp32 weights: proved
    with pytest.raises(SyncError, match=r"step 3 cannot be proved: π_θ's \['b'\] are served by no tensor"):
        prove(served, {"a.weight": w, "lm_head.weight": w, "b": w}, step=3)
    with pytest.raises(SyncError, match="serves 'c', which π_θ has no tensor for"):
        prove(served_elements([("c", w)], 0), {"a.weight": w}, step=0)
    stale = w.clone()
    stale.view(-1)[sample_positions(w.numel(), 4)[5]] += 0.1          # above a bf16 rounding
    with pytest.raises(SyncError, match=r"step 4 did not take: 'lm_head.weight' differs — the sampler serves "
                                        r"fingerprint [0-9a-f]{8}, π_θ's \(cast to torch.bfloat16\) is [0-9a-f]{8}"):
        prove(served_elements([("a.weight", w.to(torch.bfloat16)), ("lm_head.weight", stale.to(torch.bfloat16))], 4),
              {"a.weight": w, "lm_head.weight": w}, step=4)


def test_a_persistent_partial_fault_is_caught_within_a_few_syncs():
    """Rows a sync never writes (an untied embedding's unseen tokens): 5 % of the rows (of the 16-element
    blocks) stay behind at every sync. One sync misses them with probability 0.95^m = 0.44 (m = 16); drawn
    afresh, they pass 20 syncs with probability 0.44^20 — fixed draws would pass every sync with 0.44."""
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(400, 16, generator=g)
    served = theta.clone()
    served[::20] += 1.0                                              # 20 of 400 rows behind
    caught = []
    for step in range(20):
        try:
            prove(served_elements([("embed.weight", served)], step), {"embed.weight": theta}, step)
        except SyncError:
            caught.append(step)
    assert len(caught) >= 6 and caught[0] <= 5, caught                # expected: 11.2 of 20 caught


def test_a_persistent_column_fault_is_caught_within_a_few_syncs():
    """Columns a sync never writes (one rank's input shard of a row-parallel layer): the last quarter of the
    column blocks stay behind. One sync draws one block and misses them with probability 0.75; drawn afresh,
    they pass 20 syncs with probability 0.75^20 ≈ 0.003."""
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(64, 576, generator=g)
    served = theta.clone()
    served[:, 432:] += 1.0
    caught = [step for step in range(20) if crc(pick([served], "columns", torch.bfloat16, step))
              != fingerprint([theta], "columns", torch.bfloat16, step)]
    assert len(caught) >= 2 and caught[0] <= 10, caught               # expected: 5 of 20 caught


# ----------------------------------------------------------------------------- HFSampler

def hf_faulty_sync(sampler: HFSampler, policy: LMPolicy, fault: str) -> None:
    """α ← π_θ as a sync with ``fault`` does it (by name, into α's own tensors)."""
    targets = dict(sampler.model.named_parameters())
    with torch.no_grad():
        for name, tensor in pushed(policy.model.named_parameters(), fault):
            targets[name].copy_(tensor)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_hf_sampler_faults_are_caught_with_the_tensor_named(tokenizer, fault):
    policy = LMPolicy(tiny_model(), 1.0)
    sampler = HFSampler(policy, tokenizer, 8)
    sampler.prove_sync(policy, step=0)                                  # α is π_θ's copy: proved
    if fault == "leaves a tied LM head behind":                          # α's head stops sharing the embedding
        head = sampler.model.lm_head
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)
    nudge(policy.model)
    hf_faulty_sync(sampler, policy, fault)
    with pytest.raises(SyncError, match=rf"step 5 did not take: {FAULTS[fault]}"):
        sampler.prove_sync(policy, step=5)


def test_tensors_and_keys_lists_named_tensors_without_names():
    """The walk without names lists named_tensors(remove_duplicate=False)'s tensors, in order (a tied head under
    each name, a bias set to None kept as None); a module set to None leaves its mark in the keys."""
    from grpo_lab.lm.sampling import named_tensors, tensors_and_keys

    model = tiny_model()
    model.model.layers[0].self_attn.q_proj.register_parameter("bias", None)
    tensors, keys = tensors_and_keys(model)
    named = named_tensors(model, remove_duplicate=False)
    assert all(a is b for a, (_, b) in zip([t for t in tensors if t is not None], named, strict=True))
    assert any(t is None for t in tensors)
    model.model.layers[1].mlp = None
    assert tensors_and_keys(model)[1] != keys and None in tensors_and_keys(model)[1]


def test_prove_pairs_proves_only_what_prove_local_proves():
    """The paired path says True only where prove_local passes, and False at any difference it reads (a bit
    of a sampled block, a byte of a small tensor) or any layout it does not read raw."""
    from grpo_lab.fingerprint import prove_pairs

    g = torch.Generator().manual_seed(3)
    theta = [torch.randn(40, 16, generator=g), None, torch.randn(7, generator=g), torch.randn(300, generator=g).half()]
    names = ["a", "bias", "c", "d"]

    def agree(served, held, step):
        try:
            prove_local([(n, t) for n, t in zip(names, served, strict=True) if t is not None],
                        {n: t for n, t in zip(names, held, strict=True) if t is not None}, step)
            passed = True
        except SyncError:
            passed = False
        return prove_pairs(served, held, step), passed

    served = [None if t is None else t.clone() for t in theta]
    assert agree(served, theta, 2) == (True, True)
    served[0].view(-1).view(torch.int32)[sample_positions(640, 2)[7]] ^= 1
    assert agree(served, theta, 2) == (False, False)
    served[0] = theta[0].clone()
    served[2].view(torch.int32)[6] ^= 1                                 # a small tensor is compared whole
    assert agree(served, theta, 2) == (False, False)
    served[2] = theta[2].clone()
    for layout in ([served[0], torch.zeros(1), *served[2:]],                          # a None against a tensor
                   [served[0].t().contiguous().t(), *served[1:]],                     # not contiguous
                   [served[0].double(), *served[1:]]):                                # another dtype
        assert not prove_pairs(layout, theta, 2)


def test_hf_sampler_proves_a_good_sync_in_pairs_and_sees_a_replaced_weight(tokenizer, monkeypatch):
    """A good sync is proved by the paired path alone (the named path never runs); a weight replaced on either
    side after the sync (``module.weight = nn.Parameter(...)``; on α's side the next sync copies into its old
    tensor) is caught and named; structures that differ go to the named path, which pairs by name."""
    import grpo_lab.lm.sampling as sampling

    policy = LMPolicy(tiny_model(), 1.0)
    sampler = HFSampler(policy, tokenizer, 8)
    named_path = sampling.prove_local
    monkeypatch.setattr(sampling, "prove_local", lambda *a: pytest.fail("the named path ran on a good sync"))
    nudge(policy.model)
    sampler.sync(policy)
    sampler.prove_sync(policy, step=1)
    monkeypatch.setattr(sampling, "prove_local", named_path)
    layer = "model.layers.1.self_attn.k_proj.weight"
    for side in (sampler.model, policy.model):
        k_proj = side.model.layers[1].self_attn.k_proj
        weight = k_proj.weight
        sampler.sync(policy)
        k_proj.weight = torch.nn.Parameter(weight.detach() + 1.0, requires_grad=False)
        with pytest.raises(SyncError, match=rf"step 2 did not take: {re.escape(repr(layer))} differs"):
            sampler.prove_sync(policy, step=2)
        k_proj.weight = weight
        sampler.sync(policy)
        sampler.prove_sync(policy, step=2)
    calls = []
    monkeypatch.setattr(sampling, "prove_local", lambda *a: calls.append(a) or named_path(*a))
    layers = sampler.model.model.layers
    layers._modules = dict(reversed(layers._modules.items()))            # α walks its layers in another order
    sampler.prove_sync(policy, step=3)                                   # by name, as the named path pairs them
    assert len(calls) == 1
    sampler.model.model.norm.register_buffer("extra", torch.zeros(3))
    with pytest.raises(SyncError, match=r"serves 'model.norm.extra', which π_θ has no tensor for"):
        sampler.prove_sync(policy, step=3)


def test_a_run_proves_every_sync_and_logs_the_verdicts(tokenizer):
    config = GRPOConfig(G=4, prompts_per_step=2, max_completion_length=8, lr=1e-2, steps=4, seed=0, v=2)
    policy = LMPolicy(tiny_model(), config.temperature)
    loop = GRPOLoop(policy, HFSampler(policy, tokenizer, 8), EvenTokenTask(), config)
    records = list(loop.run())
    assert [r.weights_audit for r in records] == ["proved", "", "proved", ""]
    assert [r.probe_audit for r in records] == ["not judged yet", "", "judged", ""]


def test_a_run_with_a_faulty_sync_stops_at_the_first_sync_after_a_step(tokenizer):
    config = GRPOConfig(G=4, prompts_per_step=2, max_completion_length=8, lr=1e-2, steps=4, seed=0, v=1)
    policy = LMPolicy(tiny_model(), config.temperature)
    sampler = HFSampler(policy, tokenizer, 8)
    sampler.sync = lambda p: hf_faulty_sync(sampler, p, "skips a norm's weight") or 0
    loop = GRPOLoop(policy, sampler, EvenTokenTask(), config)
    with pytest.raises(SyncError, match=r"step 1 did not take: 'model.norm.weight' differs"):
        list(loop.run())
    assert [r.weights_audit for r in loop.history] == ["proved"]


# ----------------------------------------------------------------------------- the TRL route (in-process α)

@pytest.fixture(scope="module")
def tied_model_dir(tmp_path_factory):
    """trl_two_process's tiny Llama with its LM head tied to the embedding."""
    import trl_two_process as two
    from transformers import LlamaForCausalLM

    path = two.build_tiny_model(tmp_path_factory.mktemp("tied_llama"))
    model = LlamaForCausalLM.from_pretrained(path)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    model.save_pretrained(path)
    return path


def alternating_reward(completions, **kwargs):
    return [float(j % 2) for j in range(len(completions))]


@pytest.mark.parametrize("fault", list(FAULTS))
def test_trl_route_faults_are_caught_with_the_tensor_named(tied_model_dir, tmp_path, monkeypatch, fault):
    import trl_two_process as two
    from datasets import Dataset

    from grpo_lab.scale.trl import OffPolicyGRPOTrainer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = two.make_config(str(tmp_path / "out"), 1, 8, max_steps=3, vllm_sync_interval=1)
    trainer = OffPolicyGRPOTrainer(model=tied_model_dir, reward_funcs=alternating_reward, args=config,
                                   train_dataset=Dataset.from_dict({"prompt": list(two.TRAIN_PROMPTS)}))
    alpha, policy = trainer.alpha_model, trainer.accelerator.unwrap_model(trainer.model)
    assert alpha.lm_head.weight is alpha.model.embed_tokens.weight
    if fault == "leaves a tied LM head behind":
        alpha.lm_head.weight = torch.nn.Parameter(alpha.lm_head.weight.detach().clone(), requires_grad=False)

    def faulty_sync() -> None:
        targets = dict(alpha.named_parameters())
        with torch.no_grad():
            for name, tensor in pushed(policy.named_parameters(), fault):
                targets[name].copy_(tensor)

    trainer._sync_sampler = faulty_sync
    # swapped names differ from π_θ already at step 0's sync; the other faults only once π_θ moved
    step = 0 if fault == "swaps two layers' down_proj" else 1
    with pytest.raises(SyncError, match=rf"step {step} did not take: {FAULTS[fault]}"):
        trainer.train()
    assert trainer.sync_steps == list(range(step))
