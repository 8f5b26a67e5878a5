"""Seed-TTS-eval's SIM model (WavLM-large + ECAPA-TDNN) through the real loading code, with a tiny random checkpoint
in the layout of ``wavlm_large_finetune.pth``; the front end checked against s3prl's own WavLM (the upstream
Seed-TTS-eval loads through torch.hub), on espeak-ng speech."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reward_fns.speaker_similarity import WavLMEcapaBackend, build_speaker_backend
from reward_fns.testing.espeak import espeak
from reward_fns.testing.tiny_models import TINY_WAVLM, s3prl_wavlm_shapes, write_tiny_wavlm_ecapa
from reward_fns.wavlm_ecapa import (
    FRONT_END_PREFIX,
    AttentiveStatsPool,
    EcapaShape,
    EcapaTdnnHead,
    WavLMEcapa,
    read_checkpoint_state,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_wavlm_ecapa(tmp_path_factory.mktemp("sim") / "wavlm_large_finetune.pth")


@pytest.fixture(scope="module")
def backend(checkpoint):
    return build_speaker_backend(f"wavlm_ecapa:{checkpoint}")


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    root = tmp_path_factory.mktemp("espeak_sim")
    return [
        espeak("hello there", root / "a.wav"),
        espeak("good morning everyone", root / "b.wav"),
        espeak("good morning everyone", root / "c.wav", voice="en-us+f3"),
    ]


def s3prl_expert(checkpoint, directory):
    """s3prl's ``wavlm`` UpstreamExpert (what ``torch.hub.load('s3prl/s3prl', 'wavlm_large')`` builds) on the tiny
    WavLM of ``checkpoint``, from a WavLM checkpoint ``{"cfg", "model"}`` as Microsoft ships WavLM-Large.pt."""
    from s3prl.upstream.wavlm.expert import UpstreamExpert

    t = TINY_WAVLM
    cfg = {
        "extractor_mode": "layer_norm",
        "conv_feature_layers": str(t["conv"]),
        "encoder_layers": t["layers"],
        "encoder_embed_dim": t["hidden"],
        "encoder_ffn_embed_dim": t["ffn"],
        "encoder_attention_heads": t["heads"],
        "layer_norm_first": True,
        "normalize": True,
        "conv_pos": t["pos_kernel"],
        "conv_pos_groups": t["pos_groups"],
        "relative_position_embedding": True,
        "num_buckets": t["buckets"],
        "max_distance": 800,
        "gru_rel_pos": True,
    }
    state = read_checkpoint_state(checkpoint)
    wavlm = {k[len(FRONT_END_PREFIX) :]: v for k, v in state.items() if k.startswith(FRONT_END_PREFIX)}
    torch.save({"cfg": cfg, "model": wavlm}, directory / "WavLM-tiny.pt")
    return UpstreamExpert(str(directory / "WavLM-tiny.pt")).eval()  # its load_state_dict is strict


def test_the_tiny_checkpoint_has_the_key_names_of_the_real_file(checkpoint, tmp_path):
    state = torch.load(checkpoint, weights_only=True)["model"]
    s3prl_names = set(s3prl_expert(checkpoint, tmp_path).model.state_dict())
    assert s3prl_names == set(s3prl_wavlm_shapes(**TINY_WAVLM))
    assert {FRONT_END_PREFIX + k for k in s3prl_names} <= set(state)
    # UniSpeech's ECAPA_TDNN attribute names, kept by the port
    for key in ("feature_weight", "layer2.Res2Conv1dReluBn.convs.6.weight", "layer4.SE_Connect.linear2.bias"):
        assert key in state
    assert {"pooling.linear1.weight", "bn.running_var", "linear.weight"} <= set(state)


def test_front_end_hidden_states_equal_s3prl_wavlm(checkpoint, backend, speech, tmp_path):
    """The 25 (here 3) hidden states ECAPA weighs: s3prl's hooks (inputs of every layer, then the encoder's output)
    on its own normalised input, against transformers' WavLM with the renamed weights."""
    expert = s3prl_expert(checkpoint, tmp_path)
    for audio in speech:
        wav = torch.from_numpy(audio)
        with torch.no_grad():
            ref = expert([wav])["hidden_states"]
            ours = backend.model.wavlm(
                torch.nn.functional.layer_norm(wav, wav.shape)[None], output_hidden_states=True
            ).hidden_states
        assert len(ref) == len(ours) == TINY_WAVLM["layers"] + 1
        for a, b in zip(ref, ours):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_every_model_tensor_comes_from_the_checkpoint(checkpoint, backend):
    """No parameter keeps its random init: each model tensor equals one checkpoint tensor (all drawn apart)."""
    state = read_checkpoint_state(checkpoint)
    by_content = {v.numpy().tobytes(): k for k, v in state.items() if v.is_floating_point()}
    used = set()
    for name, value in backend.model.state_dict().items():
        if name.endswith("num_batches_tracked"):
            continue
        source = by_content.get(value.numpy().tobytes())
        assert source is not None, f"{name} was not loaded from the checkpoint"
        used.add(source)
    assert set(by_content.values()) - used == {FRONT_END_PREFIX + "mask_emb"}  # unused at inference, documented


def test_embeddings_shape_determinism_and_self_similarity(checkpoint, backend, speech):
    emb = backend.embed(speech)
    assert emb.shape == (3, 12) and np.isfinite(emb).all()
    again = build_speaker_backend(f"wavlm_ecapa:{checkpoint}").embed(speech)
    np.testing.assert_array_equal(again, emb)  # a fresh load: same weights, same numbers
    np.testing.assert_allclose(backend.similarity(speech, speech), 1.0, atol=1e-6)
    assert (backend.similarity(speech[:2], speech[1:]) < 1 - 1e-4).all()
    # each waveform alone, as Seed-TTS-eval: the batch it comes in does not change its embedding
    np.testing.assert_array_equal(backend.embed([speech[1]])[0], emb[1])


def test_audio_the_model_cannot_embed_is_named(backend, speech):
    with pytest.raises(ValueError, match=r"audio\[1\]: 5 samples give 0 WavLM frames"):
        backend.embed([speech[0], np.zeros(5, np.float32)])
    with pytest.raises(ValueError, match=r"audio\[0\]: NaN or inf"):
        backend.embed([np.where(np.arange(len(speech[0])) == 7, np.nan, speech[0])])


def test_gain_does_not_change_the_embedding(backend, speech):
    """WavLM-Large reads ``layer_norm(wav)``: a louder copy gives the same embedding (up to layer_norm's eps)."""
    louder = [3.0 * a for a in speech]
    np.testing.assert_allclose(backend.similarity(louder, speech), 1.0, atol=1e-4)


def test_attentive_stats_pool_matches_the_formula_by_hand():
    torch.manual_seed(0)
    pool = AttentiveStatsPool(4, attention_channels=3).double()
    x = torch.randn(2, 4, 7, dtype=torch.float64)
    w1, b1 = pool.linear1.weight[:, :, 0].detach().numpy(), pool.linear1.bias.detach().numpy()
    w2, b2 = pool.linear2.weight[:, :, 0].detach().numpy(), pool.linear2.bias.detach().numpy()
    for b in range(2):
        xb = x[b].numpy()  # [C, T]
        scores = w2 @ np.tanh(w1 @ xb + b1[:, None]) + b2[:, None]
        alpha = np.exp(scores - scores.max(axis=1, keepdims=True))
        alpha /= alpha.sum(axis=1, keepdims=True)  # softmax over time, per channel
        mean = (alpha * xb).sum(axis=1)
        std = np.sqrt(np.maximum((alpha * xb**2).sum(axis=1) - mean**2, 1e-9))
        np.testing.assert_allclose(pool(x)[b].detach().numpy(), np.concatenate([mean, std]), rtol=1e-12)


def test_layer_weights_are_a_softmax_over_hidden_states():
    """A weight far above the others selects that hidden state: the same as a one-layer head fed only with it."""
    torch.manual_seed(0)
    shape = EcapaShape(feat_dim=8, n_layers=3, channels=16, pooled_channels=12, attention_channels=4, emb_dim=5)
    head = EcapaTdnnHead(shape).double().eval()
    single = EcapaTdnnHead(EcapaShape(**{**shape.__dict__, "n_layers": 1})).double().eval()
    state = head.state_dict()
    state["feature_weight"] = torch.tensor([0.0, 60.0, 0.0], dtype=torch.float64)  # softmax: e^-60 off layer 1
    head.load_state_dict(state)
    single.load_state_dict({**state, "feature_weight": torch.zeros(1, dtype=torch.float64)})
    hidden = torch.randn(3, 2, 40, 8, dtype=torch.float64)
    torch.testing.assert_close(head(hidden), single(hidden[1:2]), rtol=1e-10, atol=1e-10)
    state["feature_weight"] = torch.zeros(3, dtype=torch.float64)  # equal weights: the mean of the states
    head.load_state_dict(state)
    torch.testing.assert_close(head(hidden), single(hidden.mean(0, keepdim=True)), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (
            lambda s: s.pop(FRONT_END_PREFIX + "encoder.layers.1.fc2.bias"),
            "wavlm.encoder.layers.1.feed_forward.output_dense.bias",
        ),
        (lambda s: s.pop("layer3.SE_Connect.linear1.weight"), "head.layer3.SE_Connect.linear1.weight"),
        (
            lambda s: s.update({FRONT_END_PREFIX + "encoder.layers.0.self_attn.bogus": torch.zeros(1)}),
            "encoder.layers.0.self_attn.bogus",
        ),
        (lambda s: s.update({"projection.weight": torch.zeros(3, 12)}), "unexpected keys ['projection.weight']"),
        (lambda s: s.update({"pooling.linear2.bias": torch.zeros(5)}), "pooling.linear2.bias (5,) (model (24,))"),
    ],
    ids=["missing-wavlm", "missing-head", "unexpected-wavlm", "unexpected-head", "shape"],
)
def test_a_key_mismatch_fails_naming_the_key(checkpoint, edit, named):
    state = read_checkpoint_state(checkpoint)
    edit(state)
    with pytest.raises(KeyError) as error:
        WavLMEcapa.from_state_dict(state, source="edited")
    assert named in str(error.value)


def test_weight_norm_saved_as_parametrizations_loads_the_same(checkpoint, backend, speech):
    state = read_checkpoint_state(checkpoint)
    pos = FRONT_END_PREFIX + "encoder.pos_conv.0."
    state[pos + "parametrizations.weight.original0"] = state.pop(pos + "weight_g")
    state[pos + "parametrizations.weight.original1"] = state.pop(pos + "weight_v")
    with torch.no_grad():
        np.testing.assert_array_equal(
            WavLMEcapa.from_state_dict(state)(torch.from_numpy(speech[0])), backend.embed(speech[:1])[0]
        )


def test_documented_exceptions_load(checkpoint):
    """``mask_emb`` (pre-training only) and BatchNorm's ``num_batches_tracked`` may be absent."""
    state = read_checkpoint_state(checkpoint)
    state = {k: v for k, v in state.items() if k != FRONT_END_PREFIX + "mask_emb" and "num_batches" not in k}
    WavLMEcapa.from_state_dict(state)


def test_the_backend_needs_a_local_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="checkpoint=PATH"):
        WavLMEcapaBackend()
    with pytest.raises(FileNotFoundError, match="absent.pth: no such file"):
        WavLMEcapa.from_checkpoint(tmp_path / "absent.pth")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("wavlm_ecapa", "speaker 'wavlm_ecapa' needs a checkpoint, wavlm_ecapa:PATH"),
        ("wavlm_ecapa:/nowhere/wavlm_large_finetune.pth", "/nowhere/wavlm_large_finetune.pth: no such file"),
        ("resemblyzer:/m/x.pth", "speaker 'resemblyzer' takes no checkpoint"),
        ("ecapa", "unknown speaker backend 'ecapa'; registered: ['resemblyzer', 'wavlm_ecapa']"),
    ],
)
def test_the_reward_settings_name_a_bad_speaker_before_loading_anything(spec, message):
    from maspo_base.typed_settings import SettingsError, build
    from reward_fns.reward_settings import ModelSettings

    with pytest.raises(SettingsError) as error:
        build(ModelSettings, {"speaker": spec}, "reward_kwargs")
    assert "reward_kwargs.speaker" in str(error.value) and message in str(error.value)


def test_the_reward_scores_similarity_with_the_seed_tts_eval_model(
    checkpoint, backend, speech, tiny_codec_dir, tiny_paraformer_dir
):
    """``speaker=wavlm_ecapa:PATH`` in the reward's settings: ``speech_similarity`` is this model's cosine."""
    from reward_fns.pipeline import SpeechReward

    reward = SpeechReward.from_spec(
        codec=str(tiny_codec_dir),
        asr=f"zh=paraformer:{tiny_paraformer_dir}",
        default_language="zh",
        speaker=f"wavlm_ecapa:{checkpoint}",
    )
    out = reward.score_audio([speech[1], speech[1]], ["你好", "你好"], prompt_audio=[speech[0], speech[2]])
    expected = backend.similarity([speech[1], speech[1]], [speech[0], speech[2]])
    assert [r["speech_similarity"] for r in out] == pytest.approx(list(expected), abs=1e-6)
