"""FunASR's real local-directory loading path, with a tiny randomly initialised Paraformer the test writes."""

import numpy as np
import pytest
import torch

from reward_fns.asr import ASR_BACKEND_REGISTRY, FunAsrBackend, get_asr_backend_cls, register_asr_backend
from reward_fns.testing.tiny_models import TINY_PARAFORMER_CHARS


@pytest.fixture(scope="module")
def paraformer(tiny_paraformer_dir):
    return FunAsrBackend(model=str(tiny_paraformer_dir), device="cpu")


def test_paraformer_random_weights_loads_from_local_dir(tiny_paraformer_dir, paraformer):
    saved = torch.load(tiny_paraformer_dir / "model.pt", map_location="cpu")
    loaded = paraformer.model.model.state_dict()
    assert set(saved) == set(loaded)
    for key in list(saved)[:: max(1, len(saved) // 10)]:
        torch.testing.assert_close(loaded[key], saved[key], rtol=0, atol=0)
    # the am.mvn written by the test is the frontend's CMVN: (x + shift) * scale
    cmvn = paraformer.model.kwargs["frontend"].cmvn
    assert cmvn.shape == (2, 560) and float(cmvn[0, 0]) == -8.0 and float(cmvn[1, 0]) == pytest.approx(0.3)


def test_paraformer_random_weights_transcribes_in_input_order(paraformer):
    rng = np.random.default_rng(0)
    audio = [rng.standard_normal(n).astype(np.float32) * 0.1 for n in (16000, 6400, 24000)]
    batched = paraformer.transcribe(audio, ["zh"] * 3)
    assert batched == [paraformer.transcribe([a], ["zh"])[0] for a in audio]
    assert all(isinstance(t, str) and set(t) <= set(TINY_PARAFORMER_CHARS + " ") for t in batched)


def test_registry_names_what_is_registered():
    assert {"paraformer", "sensevoice", "faster_whisper"} <= set(ASR_BACKEND_REGISTRY)
    with pytest.raises(ValueError, match="registered: .*faster_whisper"):
        get_asr_backend_cls("whisperx")

    @register_asr_backend("test_upper")
    class Upper(FunAsrBackend):
        def postprocess(self, text):
            return text.upper()

    assert get_asr_backend_cls("test_upper") is Upper
    del ASR_BACKEND_REGISTRY["test_upper"]


def test_paraformer_random_weights_same_audio_gives_the_same_features_every_call(paraformer):
    """FunASR's frontend dithers by default (random noise per call); the backend turns it off."""
    frontend = paraformer.model.kwargs["frontend"]
    assert frontend.dither == 0.0
    audio = torch.from_numpy(np.random.default_rng(1).standard_normal(16000).astype(np.float32) * 0.1)[None]
    first, _ = frontend(audio, torch.tensor([16000]))
    second, _ = frontend(audio, torch.tensor([16000]))
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    texts = [paraformer.transcribe([audio[0].numpy()], ["zh"])[0] for _ in range(5)]
    assert len(set(texts)) == 1
