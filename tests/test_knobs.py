"""grpo_lab.scale.knobs: each knob of GRPOConfig is spelled once for the TRL route. A new GRPOConfig field
fails here until it has a KnobSpec row (or an entry in NOT_ONE_TO_ONE saying why it cannot have one); the row
alone then maps it in trl_args, validates it in OffPolicyGRPOConfig and gives its field's default and help
(a new TRL-side name also needs its one-line ``lab_field`` declaration, which a test here asks for)."""

import dataclasses
import warnings

import pytest
import trl
from transformers import HfArgumentParser

from grpo_lab.config import GRPOConfig
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.scale.knobs import KNOBS, NOT_ONE_TO_ONE, TRL_OPTIMIZERS, field_docs, lab_field
from grpo_lab.scale.launch import trl_args
from grpo_lab.scale.trl import OffPolicyGRPOConfig

LAB_FIELDS = {f.name: f for f in dataclasses.fields(GRPOConfig)}
OFF_POLICY_FIELDS = {f.name: f for f in dataclasses.fields(OffPolicyGRPOConfig)}
TRL_FIELDS = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
DECLARED = set(OffPolicyGRPOConfig.__dict__["__annotations__"])  # declared in the class body itself
BAD_VALUES = (-1, 0, 0.0, 0.5, "bogus", None, float("nan"), True)


def off_policy_config(tmp_path, **values):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' deprecation notices
        return OffPolicyGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **values)


def test_every_grpo_config_field_has_a_row_or_a_reason():
    rows = [knob.lab_name for knob in KNOBS]
    assert len(set(rows)) == len(rows), f"a GRPOConfig field has two rows: {rows}"
    trl_names = [knob.trl_name for knob in KNOBS]
    assert len(set(trl_names)) == len(trl_names), f"two rows share a TRL name: {trl_names}"
    assert not set(rows) & set(NOT_ONE_TO_ONE), "a field is both a row and in NOT_ONE_TO_ONE"
    missing = set(LAB_FIELDS) - set(rows) - set(NOT_ONE_TO_ONE)
    assert not missing, (f"GRPOConfig field(s) {sorted(missing)} have no row in grpo_lab.scale.knobs.KNOBS: add "
                         "KnobSpec(lab_name, trl_name), or an entry in NOT_ONE_TO_ONE saying why there can be none")
    stale = (set(rows) | set(NOT_ONE_TO_ONE)) - set(LAB_FIELDS)
    assert not stale, f"KNOBS / NOT_ONE_TO_ONE name(s) {sorted(stale)} that GRPOConfig no longer has"
    assert all(reason.strip() for reason in NOT_ONE_TO_ONE.values())


def test_every_row_is_a_field_and_a_mirrored_one_comes_from_grpo_config():
    """A row's TRL name is an OffPolicyGRPOConfig field. Where OffPolicyGRPOConfig declares it (the adapter's
    own knobs, and TRL's whose default it changes), it is ``lab_field``'s: GRPOConfig's default and docstring."""
    docs = field_docs(GRPOConfig)
    assert set(docs) == set(LAB_FIELDS), f"GRPOConfig fields without a docstring: {set(LAB_FIELDS) - set(docs)}"
    for knob in KNOBS:
        assert knob.trl_name in OFF_POLICY_FIELDS, (
            f"{knob.trl_name} (GRPOConfig.{knob.lab_name}) is not a field of OffPolicyGRPOConfig: declare "
            f"`{knob.trl_name}: <type> = lab_field({knob.lab_name!r})` there")
        if knob.trl_name in DECLARED or knob.trl_name not in TRL_FIELDS:
            declared = OFF_POLICY_FIELDS[knob.trl_name]
            assert declared.default == LAB_FIELDS[knob.lab_name].default, knob
            assert declared.metadata["help"] % () == f"GRPOConfig.{knob.lab_name}: {docs[knob.lab_name]}", knob
    with pytest.raises(ValueError, match="'prompts_per_step' has no row in KNOBS"):
        lab_field("prompts_per_step")
    help_text = " ".join(HfArgumentParser(OffPolicyGRPOConfig).format_help().split())  # argparse %-formats it
    assert "GRPOConfig.v: Sync period" in help_text and "k % v == 0" in help_text


def test_trl_args_map_every_row(tmp_path):
    """A recipe whose knobs are all off their defaults: each row's TRL field carries the mapped value."""
    config = TrainConfig(G=4, prompts_per_step=4, v=3, i=2, sync="adaptive", sync_threshold=0.3, eps_low=0.1,
                         eps_high=0.28, band="multiplicative", beta=0.04, kl_importance_weighted=True,
                         kl_weight_differentiable=True, ref_period=5,
                         eps_std=1e-3, unbiased_std=True, eps_placement="added_to_std", mask_zero_variance=False,
                         mask_normalize="unmasked", empty_step="optimizer_step", loss_type="bnpo", level="sequence",
                         lr=1e-5, optimizer="sgd", weight_decay=0.1, max_grad_norm=None, max_completion_length=16,
                         temperature=0.7, steps=7, seed=3, device="cpu", output_dir=str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = trl_args(config, {}, num_processes=1)
    for knob in KNOBS:
        assert getattr(args, knob.trl_name) == knob.trl_value(config), knob
    assert (args.optim, args.max_grad_norm) == ("sgd", 0.0)  # the two mapped values
    assert set(TRL_OPTIMIZERS) == {"adamw", "sgd"} and args.max_steps == 14 and args.ref_model_sync_steps == 10


def test_trl_args_pass_alphas_truncation(tmp_path):
    """TrainConfig's top_p / top_k (α's truncation: fields of an LM run, not knobs of GRPOConfig) reach TRL's
    fields of the same names, untruncated by default; OffPolicyGRPOConfig refuses what TrainConfig refuses."""
    for top_p, top_k in ((1.0, 0), (0.9, 20)):
        config = TrainConfig(G=4, prompts_per_step=4, top_p=top_p, top_k=top_k, device="cpu",
                             output_dir=str(tmp_path))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = trl_args(config, {}, num_processes=1)
        assert (args.top_p, args.top_k) == (top_p, top_k)
    for bad in ({"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}, {"top_k": 2.5}):
        (name,) = bad
        with pytest.raises(ValueError, match=rf"^{name} must"):
            TrainConfig(**bad)
        with pytest.raises(ValueError, match=rf"^{name} must"):
            off_policy_config(tmp_path, **bad)


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.to_trl is None], ids=lambda k: k.trl_name)
def test_off_policy_config_refuses_what_grpo_config_refuses(tmp_path, knob):
    """Every value GRPOConfig refuses for a knob, OffPolicyGRPOConfig refuses under the TRL name, and the
    values GRPOConfig takes pass (unless TRL itself refuses them)."""
    for value in BAD_VALUES:
        try:
            GRPOConfig(**{knob.lab_name: value})
        except ValueError:
            with pytest.raises(ValueError, match=rf"^{knob.trl_name}\b"):
                off_policy_config(tmp_path, **{knob.trl_name: value})
    default = LAB_FIELDS[knob.lab_name].default
    if knob.trl_name != "epsilon_high":  # TRL fills None with epsilon
        assert getattr(off_policy_config(tmp_path, **{knob.trl_name: default}), knob.trl_name) == default


def test_rules_joining_knobs_apply_too(tmp_path, monkeypatch):
    """The last check runs GRPOConfig on all the knobs together (a rule across two fields)."""
    original = GRPOConfig.__post_init__

    def joint_rule(self):
        original(self)
        if self.sync == "adaptive" and self.v == 1:
            raise ValueError("sync = 'adaptive' needs v > 1")

    monkeypatch.setattr(GRPOConfig, "__post_init__", joint_rule)
    off_policy_config(tmp_path, sync="adaptive", vllm_sync_interval=2)
    with pytest.raises(ValueError, match="needs v > 1"):
        off_policy_config(tmp_path, sync="adaptive", vllm_sync_interval=1)


def test_stock_trl_config_is_built_from_the_same_values_as_the_adapters():
    """Stock TRL's config (the studies' and the benchmarks' peer) takes every value the adapter's has a stock field
    for, from one builder; what stock TRL is told where its defaults differ is the kit's recipe."""
    from grpo_lab.scale.launch import STOCK_TRL_SETTINGS, stock_trl_config, trl_values_of_run

    config = TrainConfig(G=4, prompts_per_step=3, lr=3e-6, beta=0.02, temperature=0.9, max_completion_length=12,
                         loss_type="grpo", seed=7, micro_batch_size=6, output_dir="/tmp/unused")
    stock = stock_trl_config(config)
    shared = {f.name for f in dataclasses.fields(trl.GRPOConfig)} & set(trl_values_of_run(config, 1))
    assert {"num_generations", "learning_rate", "beta", "epsilon", "loss_type", "optim", "temperature",
            "per_device_train_batch_size", "gradient_accumulation_steps", "use_bias_correction_kl"} <= shared
    for name in shared - {"report_to"}:      # TrainingArguments turns report_to = "none" into []
        assert getattr(stock, name) == trl_values_of_run(config, 1)[name], name
    assert stock.report_to == []
    assert (stock.per_device_train_batch_size, stock.gradient_accumulation_steps) == (6, 2)
    assert stock.optim == "adamw_torch" and not stock.use_bias_correction_kl      # the kit's AdamW and KL gradient
    assert all(getattr(stock, k) == v for k, v in STOCK_TRL_SETTINGS.items()) and stock.data_seed == 7
    assert stock_trl_config(config, extras={"max_steps": 5}).max_steps == 5
