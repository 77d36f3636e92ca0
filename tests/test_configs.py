"""Every shipped config parses; unknown keys, wrong types and bad splits are errors naming the key;
batch accounting follows the paper's two options."""

import os

import pytest

from ipu_packing.train import ConfigError, available_configs, load_config

EXPECTED = {
    "demo", "demo_padded", "demo_512", "demo_512_padded",
    "bert_base_512_pod16", "bert_base_512_pod16_padded", "bert_base_512_pod64", "bert_base_512_pod64_padded",
    "bert_large_512_pod16", "bert_large_512_pod16_padded", "bert_large_512_pod64", "bert_large_512_pod64_padded",
    "bert_large_512_pod128",
}


def test_shipped_configs_are_the_expected_set():
    assert EXPECTED <= set(available_configs())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_shipped_config_loads(name):
    config = load_config(name)
    assert config.name == name
    layers = config.model.get("num_hidden_layers", 12)
    if config.execution.layers_per_ipu:
        assert sum(config.execution.layers_per_ipu) == layers
    # the step's sequences unpacked (the micro batch the config names) are the stated global batch, and packed
    # (at the nominal packing factor) within half a pack a replica of it
    accounting = config.batch_accounting(config.nominal_packing_factor)
    assert (accounting.unpacked_accumulation * config.execution_spec.micro_batch_size
            * config.execution_spec.replication_factor == config.training.global_batch_sequences)
    if accounting.named_micro_batch:
        assert abs(accounting.expected_sequences_per_step - config.training.global_batch_sequences) <= (
            0.5 * config.nominal_packing_factor * config.execution.replication_factor)
    config.bert_config()  # a valid transformers.BertConfig


@pytest.mark.parametrize("size,pod,layers,split,micro,replicas,accumulation,amp,loss_scale,bias_correction", [
    ("large", "pod16", 24, [3, 7, 7, 7], 2, 4, 2048, [0.10, 0.15, 0.15, 0.15], 8192.0, True),
    ("large", "pod64", 24, [3, 7, 7, 7], 2, 16, 512, [0.13, 0.19, 0.19, 0.19], 16384.0, True),
    ("base", "pod16", 12, [0, 4, 4, 4], 8, 4, 512, [0.25], 128.0, False),
    ("base", "pod64", 12, [0, 4, 4, 4], 8, 16, 128, [0.25], 128.0, False),
])
def test_ipu_configs_follow_the_published_ones(size, pod, layers, split, micro, replicas, accumulation, amp, loss_scale,
                                              bias_correction):
    packed = load_config("bert_%s_512_%s" % (size, pod))
    padded = load_config("bert_%s_512_%s_padded" % (size, pod))
    for config in (packed, padded):
        ex = config.execution
        assert config.model["num_hidden_layers"] == layers
        assert (ex.backend, ex.layers_per_ipu, ex.micro_batch_size, ex.replication_factor) == (
            "poptorch", split, micro, replicas)
        assert ex.available_memory_proportion == amp and ex.loss_scaling == loss_scale and ex.precision == "fp16"
        assert config.training.global_batch_sequences == 16384 and config.training.steps == 2137
        assert config.optimizer.name == "lamb" and config.optimizer.lr == 0.002828
        assert config.optimizer.bias_correction is bias_correction
        assert config.schedule.warmup_fraction == 0.128 and config.schedule.decay == "linear"
        assert config.data.max_seq_length == 512
    assert padded.data.layout == "padded" and padded.execution.gradient_accumulation == accumulation
    # packed: the published packing factor 2.0 at S=512 halves the accumulation (option 1)
    assert packed.data.layout == "packed" and packed.execution.gradient_accumulation == accumulation // 2


def test_batch_accounting_option_1_divides_accumulation():
    config = load_config("bert_large_512_pod16")
    acc = config.batch_accounting(1.7)
    assert acc.method == "accumulation"
    assert acc.unpacked_accumulation == 2048
    assert acc.gradient_accumulation == 1205  # ceil(2048 / 1.7)
    assert acc.execution.gradient_accumulation == 1205
    assert acc.betas == (0.9, 0.999)
    assert config.execution_spec.gradient_accumulation == 1  # the parsed section is never rewritten


def test_batch_accounting_option_2_raises_betas():
    config = load_config("bert_large_512_pod16", ["training.batch_accounting=betas"])
    acc = config.batch_accounting(2.0)
    assert acc.gradient_accumulation == 2048
    assert acc.betas == pytest.approx((0.81, 0.999 ** 2))
    assert "betas" in acc.describe()


def test_overrides_are_dotted_and_typed():
    config = load_config("demo", ["training.steps=7", "optimizer.betas=[0.8, 0.9]", "data.layout=padded"])
    assert config.training.steps == 7
    assert config.optimizer.betas == [0.8, 0.9]
    assert config.data.path.endswith(os.path.join("demo_128", "padded"))


@pytest.mark.parametrize("override,message", [
    ("training.stepz=3", "training.stepz"),
    ("training.steps=abc", "training.steps"),
    ("optimizer.lr=[1]", "optimizer.lr"),
    ("model.hidden_sise=64", "model.hidden_sise"),
    ("model.hidden_size=1.5", "model.hidden_size"),
    ("execution.micro_batchsize=2", "execution.micro_batchsize"),
    ("execution.micro_batch_size=two", "execution.micro_batch_size"),
    ("execution.gradient_accumulation=4", "execution.gradient_accumulation"),
    ("execution.layers_per_ipu=[1, 2]", "execution.layers_per_ipu"),
    ("nosection.key=1", "nosection"),
    ("training.global_batch_sequences=10", "training.global_batch_sequences"),
    ("data.layout=sideways", "data.layout"),
    ("schedule.decay=cosine", "schedule.decay"),
    ("logging.tensorboard=maybe", "logging.tensorboard"),
])
def test_config_errors_name_the_key(override, message):
    with pytest.raises(ConfigError) as info:
        load_config("demo", [override])
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_pipeline_split_must_sum_to_layers():
    with pytest.raises(ConfigError) as info:
        load_config("bert_large_512_pod16", ["execution.layers_per_ipu=[3, 7, 7, 6]"])
    assert str(info.value) == "execution.layers_per_ipu [3, 7, 7, 6] sums to 23, but model.num_hidden_layers is 24"


def test_unknown_section_and_missing_config(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {}\ntrainer: {steps: 3}\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(bad))
    assert "trainer" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config("no_such_config")
    assert "no_such_config" in str(info.value)
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(broken))
    assert "not valid YAML" in str(info.value)


def test_model_section_fields_are_bert_config_arguments():
    import inspect

    import transformers

    from ipu_packing.model.pretrained import BERT_CONFIG_FIELDS

    params = inspect.signature(transformers.BertConfig.__init__).parameters
    expected = {name: p.default for name, p in params.items() if name not in ("self", "kwargs")}
    assert dict(BERT_CONFIG_FIELDS) == expected


def test_batch_arithmetic_methods_beside_the_fields():
    from ipu_packing.train.sections import TrainingConfig

    option_1 = TrainingConfig(global_batch_sequences=16384)
    assert option_1.unpacked_accumulation(2, 4) == 2048
    assert option_1.gradient_accumulation(2, 4, 2.0) == 1024
    assert option_1.gradient_accumulation(2, 4, 1.7) == 1205  # nearest integer to 1204.7
    assert option_1.gradient_accumulation(8, 1, 5000.0) == 1  # never below one micro batch
    assert option_1.betas([0.9, 0.999], 2.0) == (0.9, 0.999)
    option_2 = TrainingConfig(global_batch_sequences=16384, batch_accounting="betas")
    assert option_2.gradient_accumulation(2, 4, 2.0) == 2048
    assert option_2.betas([0.9, 0.999], 2.0) == pytest.approx((0.81, 0.998001))
    with pytest.raises(ConfigError, match="not a multiple of execution.micro_batch_size"):
        option_1.unpacked_accumulation(3, 1)


def test_base_merges_key_by_key_and_refuses_cycles(tmp_path):
    (tmp_path / "parent.yaml").write_text("training:\n  steps: 7\n  seed: 3\ndata:\n  layout: padded\n")
    (tmp_path / "child.yaml").write_text("base: parent\ntraining:\n  seed: 9\n")
    config = load_config(str(tmp_path / "child.yaml"), ["data.num_workers=2"])
    assert (config.name, config.training.steps, config.training.seed) == ("child", 7, 9)
    assert (config.data.layout, config.data.num_workers) == ("padded", 2)
    (tmp_path / "a.yaml").write_text("base: b\n")
    (tmp_path / "b.yaml").write_text("base: a\n")
    with pytest.raises(ConfigError, match="base cycle"):
        load_config(str(tmp_path / "a.yaml"))


def test_a_copied_config_extends_the_shipped_base_its_name_names(tmp_path):
    """configs/finetune_demo.yaml copied elsewhere still says `base: demo`: with no demo.yaml beside it, the shipped
    demo is its base; one beside it comes first; neither is one line naming both places."""
    from ipu_packing.train.loader import CONFIG_DIR, resolve_config_path

    copy = tmp_path / "mine.yaml"
    copy.write_text(open(resolve_config_path("finetune_demo")).read())
    assert load_config(str(copy)).to_dict() == dict(load_config("finetune_demo").to_dict(), name="mine")
    (tmp_path / "demo.yaml").write_text("training:\n  steps: 7\n")  # beside the file: it wins
    assert load_config(str(copy)).training.steps == 300  # finetune_demo's own value over the base's
    assert load_config(str(copy)).model_value("hidden_size") == 768  # the local base has no model: section
    (tmp_path / "orphan.yaml").write_text("base: nowhere\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(tmp_path / "orphan.yaml"))
    assert str(info.value) == "base config 'nowhere' of %s not found (%s nor %s)" % (
        tmp_path / "orphan.yaml", tmp_path / "nowhere.yaml", os.path.join(CONFIG_DIR, "nowhere.yaml"))


def test_execution_keys_are_the_dataclass_fields(monkeypatch):
    """A field added to ExecutionConfig is a valid, type-checked key with no change to the loader."""
    import dataclasses

    import ipu_packing.execution as execution

    @dataclasses.dataclass
    class Extended(execution.ExecutionConfig):
        new_knob: int = 1

    monkeypatch.setattr(execution, "ExecutionConfig", Extended)
    assert load_config("demo", ["execution.new_knob=5"]).execution.new_knob == 5
    with pytest.raises(ConfigError, match="execution.new_knob must be an integer"):
        load_config("demo", ["execution.new_knob=five"])
    with pytest.raises(ConfigError, match="unknown key execution.old_knob"):
        load_config("demo", ["execution.old_knob=5"])


@pytest.mark.slow
def test_demo_512_packed_steps_hold_as_many_sequences_as_the_padded_ones(tmp_path):
    """make compare is like for like: on the data it prepares (the embedded corpus at S=512, K=3), the packed
    run's accumulation / measured packing factor gives the padded step's sequences within 1% (compare warns
    above 5%), and the config's estimate is that measured factor."""
    from ipu_packing.data import open_dataset
    from ipu_packing.data.text.pipeline import PrepareConfig, prepare
    from ipu_packing.data.write.datasets import PackingOptions

    output = str(tmp_path / "demo_512")
    prepare(PrepareConfig(input="default", output=output, max_seq_length=512,
                          packing=PackingOptions(max_sequences_per_pack=3, workers=1, progress=False)))
    factor = open_dataset(os.path.join(output, "packed"), verify=False).packing_factor
    packed, padded = load_config("demo_512"), load_config("demo_512_padded")
    # the estimate is the factor of the pinned stack's data (1.933); the default vocabulary, hence the data,
    # depends on the tokenizers version (0.20.3 on the Poplar SDK's Python 3.8 gives 1.915)
    assert packed.data.packing_factor_estimate == pytest.approx(factor, rel=0.01)
    padded_step = padded.batch_accounting(1.0).expected_sequences_per_step
    packed_step = packed.batch_accounting(factor).expected_sequences_per_step
    assert padded_step == padded.training.global_batch_sequences == 58
    assert abs(packed_step / padded_step - 1.0) < 0.01
    assert (packed.training.steps, packed.training.seed) == (padded.training.steps, padded.training.seed)
