"""Models: exact parameter counts of facts section 6, one working SGD step each, config errors."""

from pathlib import Path

import pytest
import torch
import yaml

from accordion_repro.errors import ConfigError
from accordion_repro.models import (MODEL_NAMES, build_model, count_parameters,
                                    detach_hidden)

torch.set_num_threads(1)

CONF_DIR = Path(__file__).resolve().parents[1] / "conf" / "model"
WIKITEXT2_VOCAB = 33_278
IMAGE_MODELS = [name for name in MODEL_NAMES if name != "lstm"]

PAPER_COUNTS = [  # (name, options, CIFAR-10 count, CIFAR-100 count), facts section 6
    ("resnet18", {}, 11_173_962, 11_220_132),
    ("vgg19bn", {}, 20_565_834, 39_327_652),
    ("senet18", {}, 11_267_842, 11_314_012),
    ("senet18", {"stage4_channels": 516}, 11_389_726, 11_436_256),
    ("densenet", {}, 1_000_618, 1_035_268),
    ("googlenet", {}, 6_166_250, 6_258_500),
]


def lstm_formula(vocab, embedding, hidden, layers, tied):
    """V*E + sum_l 4H(in_l + H + 2) + V, plus H*V when the decoder has its own matrix."""
    recurrent = sum(4 * hidden * ((embedding if l == 0 else hidden) + hidden + 2)
                    for l in range(layers))
    return vocab * embedding + recurrent + vocab + (0 if tied else hidden * vocab)


def count_on_meta(name, **kwargs):
    """Count without allocating: the 39M-parameter VGG and 31M-parameter LSTM stay cheap."""
    with torch.device("meta"):
        return count_parameters(build_model(name, **kwargs))


def test_model_names_follow_the_contract():
    assert MODEL_NAMES == ("resnet18", "vgg19bn", "senet18", "densenet", "googlenet", "lstm")


@pytest.mark.parametrize("name,options,cifar10,cifar100", PAPER_COUNTS)
def test_parameter_counts_match_the_paper_models(name, options, cifar10, cifar100):
    assert count_on_meta(name, num_classes=10, **options) == cifar10
    assert count_on_meta(name, num_classes=100, **options) == cifar100


def test_lstm_parameter_count_on_wikitext2_vocabulary():
    assert count_on_meta("lstm", vocab_size=WIKITEXT2_VOCAB) == 31_819_578
    assert lstm_formula(WIKITEXT2_VOCAB, 650, 650, 3, True) == 31_819_578


@pytest.mark.parametrize("tied", [True, False])
def test_lstm_parameter_count_on_small_vocabulary(tied):
    model = build_model("lstm", vocab_size=97, num_layers=2, hidden_size=24,
                        embedding_size=24, tied=tied, dropout=0.0)
    assert count_parameters(model) == lstm_formula(97, 24, 24, 2, tied)
    assert (model.decoder.weight is model.encoder.weight) == tied


def test_untied_lstm_may_have_different_embedding_and_hidden_sizes():
    model = build_model("lstm", vocab_size=50, num_layers=1, hidden_size=12,
                        embedding_size=8, tied=False)
    assert count_parameters(model) == lstm_formula(50, 8, 12, 1, False)


def test_width_multiplier_shrinks_resnet_but_keeps_its_shape():
    small = build_model("resnet18", num_classes=10, width=0.25)
    assert count_parameters(small) < count_parameters(build_model("resnet18", num_classes=10)) / 10
    assert small(torch.randn(2, 3, 32, 32)).shape == (2, 10)


SCALE_DIR = CONF_DIR.parent / "scale"


def cpu_widths(scale: str) -> dict[str, float]:
    return yaml.safe_load((SCALE_DIR / f"{scale}.yaml").read_text())["scale"]["width"]


@pytest.mark.parametrize("name,options,cifar10,cifar100", PAPER_COUNTS)
def test_width_one_is_the_paper_model(name, options, cifar10, cifar100):
    assert count_on_meta(name, num_classes=10, width=1.0, **options) == cifar10


@pytest.mark.parametrize("scale", ["cpu", "cpu_full"])
@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_cpu_width_keeps_the_layout_and_trains(name, scale):
    width = cpu_widths(scale)[name]
    assert 0 < width < 1
    with torch.device("meta"):
        paper = build_model(name, num_classes=10)
    small = build_model(name, num_classes=10, width=width)
    assert [p.dim() for p in small.parameters()] == [p.dim() for p in paper.parameters()]
    assert count_parameters(small) < count_parameters(paper) / 3
    torch.manual_seed(0)
    loss = torch.nn.functional.cross_entropy(small(torch.randn(8, 3, 32, 32)), torch.arange(8) % 10)
    loss.backward()
    grads = [p.grad for p in small.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    # A one-unit SE gate can be dead (ReLU) on a small batch; nearly every tensor still learns.
    assert sum(bool(g.abs().sum() > 0) for g in grads) >= 0.95 * len(grads)


def official_senet18_shapes(num_classes=10, stages=(64, 128, 256, 512), reduction=16):
    """Parameter shapes of weiaicunzai's SE-ResNet-18 in its registration order: per block the
    residual (conv+bias, BN, conv+bias, BN), then the shortcut (1x1 conv+bias, BN) where there
    is one, then the excitation (Linear C->C/16, Linear C/16->C)."""
    shapes = [(64, 3, 3, 3), (64,), (64,), (64,)]
    cin = 64
    for index, c in enumerate(stages):
        for block in range(2):
            stride = 2 if index > 0 and block == 0 else 1
            shapes += [(c, cin, 3, 3), (c,), (c,), (c,), (c, c, 3, 3), (c,), (c,), (c,)]
            if stride != 1 or cin != c:
                shapes += [(c, cin, 1, 1), (c,), (c,), (c,)]
            shapes += [(c // reduction, c), (c // reduction,), (c, c // reduction), (c,)]
            cin = c
    return shapes + [(num_classes, cin), (num_classes,)]


@pytest.mark.parametrize("stage4", [512, 516])
def test_senet_parameter_order_is_the_official_one(stage4):
    with torch.device("meta"):
        model = build_model("senet18", num_classes=10, stage4_channels=stage4)
    official = official_senet18_shapes(stages=(64, 128, 256, stage4))
    assert len(official) == 114
    assert [tuple(p.shape) for p in model.parameters()] == official


def sgd_step_changes_every_parameter(model, loss_fn):
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.zero_grad()
    loss = loss_fn()
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    for (name, param), old in zip(model.named_parameters(), before):
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
        assert not torch.equal(param.detach(), old), f"{name} did not change"


@pytest.mark.slow
@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_one_training_step_of_each_image_model(name):
    torch.manual_seed(0)
    model = build_model(name, num_classes=10).train()
    images, labels = torch.randn(2, 3, 32, 32), torch.tensor([3, 7])

    def loss_fn():
        logits = model(images)
        assert logits.shape == (2, 10)
        return torch.nn.functional.cross_entropy(logits, labels)

    sgd_step_changes_every_parameter(model, loss_fn)


def test_one_training_step_of_the_lstm_with_truncated_bptt():
    torch.manual_seed(0)
    vocab, steps, batch = 40, 5, 2
    model = build_model("lstm", vocab_size=vocab, num_layers=2, hidden_size=16,
                        embedding_size=16, tied=True, dropout=0.2).train()
    hidden = model.init_hidden(batch)
    assert [h.shape for h in hidden] == [(2, batch, 16)] * 2
    assert all(h.device == model.encoder.weight.device and not h.any() for h in hidden)
    tokens = torch.randint(vocab, (steps + 1, batch))

    def loss_fn():
        logits, new_hidden = model(tokens[:-1], hidden)
        assert logits.shape == (steps, batch, vocab)
        assert new_hidden[0].requires_grad
        assert not any(h.requires_grad for h in detach_hidden(new_hidden))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[1:].reshape(-1))

    sgd_step_changes_every_parameter(model, loss_fn)


@pytest.mark.parametrize("path", sorted(CONF_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_conf_defaults_build_the_paper_model(path):
    options = yaml.safe_load(path.read_text())
    name = options.pop("name")
    assert name == path.stem
    sizes = {"vocab_size": WIKITEXT2_VOCAB} if name == "lstm" else {"num_classes": 10}
    expected = {row[0]: row[2] for row in PAPER_COUNTS if not row[1]}
    expected["lstm"] = 31_819_578
    assert count_on_meta(name, **sizes, **options) == expected[name]


def test_every_model_has_a_conf_file():
    assert sorted(p.stem for p in CONF_DIR.glob("*.yaml")) == sorted(MODEL_NAMES)


@pytest.mark.parametrize("kwargs,key", [
    ({"name": "resnet50", "num_classes": 10}, "model.name"),
    ({"name": "resnet18", "num_classes": 10, "depth": 34}, "model.depth"),
    ({"name": "vgg19bn", "num_classes": 10, "width": -0.5}, "model.width"),
    ({"name": "googlenet", "num_classes": 10, "width": "half"}, "model.width"),
    ({"name": "resnet18", "num_classes": 10, "width": 0}, "model.width"),
    ({"name": "senet18", "num_classes": 10, "stage4_channels": 8}, "model.stage4_channels"),
    ({"name": "senet18", "num_classes": 10, "stage4_channels": 512.5}, "model.stage4_channels"),
    ({"name": "lstm", "vocab_size": 10, "dropout": 1.0}, "model.dropout"),
    ({"name": "lstm", "vocab_size": 10, "tied": "yes"}, "model.tied"),
    ({"name": "lstm", "vocab_size": 10, "num_layers": 0}, "model.num_layers"),
    ({"name": "lstm", "vocab_size": 10, "embedding_size": 32, "hidden_size": 16}, "model.tied"),
    ({"name": "resnet18", "vocab_size": 100}, "model.name"),
    ({"name": "lstm", "num_classes": 10}, "model.name"),
    ({"name": "densenet", "num_classes": 0}, "dataset.num_classes"),
])
def test_bad_config_raises_config_error_naming_the_key(kwargs, key):
    kwargs = dict(kwargs)
    with pytest.raises(ConfigError) as caught:
        build_model(kwargs.pop("name"), **kwargs)
    assert caught.value.key == key


def test_unknown_model_message_lists_the_choices():
    with pytest.raises(ConfigError, match="unknown model 'x'; choose one of resnet18, vgg19bn"):
        build_model("x", num_classes=10)


def test_tied_lstm_sizes_are_checked_with_the_options_before_any_rank_starts():
    """Issue 56's CLI audit (lstm-tied-sizes): model.embedding_size=8 with hidden_size=16 was
    refused only when the model was built, after resolved.yaml was written, and after the
    validation's warnings. The settings refuse it, naming model.tied."""
    from accordion_repro.models.factory import model_settings

    options = {"num_layers": 1, "hidden_size": 16, "embedding_size": 8, "tied": True,
               "dropout": 0.0}
    with pytest.raises(ConfigError, match="embedding_size == hidden_size") as err:
        model_settings("lstm", options)
    assert err.value.key == "model.tied"
    assert model_settings("lstm", {**options, "tied": False}).embedding_size == 8
