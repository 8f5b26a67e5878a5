"""Every setting of the speech reward, listed once: the veRL ``reward_kwargs``, `SpeechReward.from_spec` and the
``maspo-verl reward-server`` flags are all derived from the dataclasses here.

- `ModelSettings`: the models and how a batch is scored (both backends).
- `BatchSettings`: dynamic batching of concurrent requests (both backends).
- `ClientSettings`: the veRL side of the server backend (``server_url`` selects it).
- `ServerSettings`: what only the server process has (address, body limit, timeout, logging).
- `ServeSettings`: the reward as a Ray Serve application (``serve_app`` selects it; `reward_fns.ray_serve`).

Values are filled by `maspo_base.typed_settings.build`: an unknown key, a wrong type or a NaN/inf is rejected with the
full key named (``reward_kwargs.max_wait_ms``, ``--max-wait-ms``). A field's ``metadata["help"]`` is its CLI help;
``metadata["flag"]`` renames its flag, ``metadata["cli"]`` is ``"append"`` (repeatable) or ``"json"`` (a JSON value).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from maspo_base.llasa_response import DEFAULT_MAX_CODES, DEFAULT_MAX_SECONDS
from maspo_base.typed_settings import InvalidSetting, SettingsError, build
from reward_fns.reward import RewardConfig

DEFAULT_MAX_BODY_MB = 32.0  # 30 s of prompt_audio as JSON floats is ~10 MB


WhisperComputeType = Literal[
    "default", "auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16",
    "float32",
]  # fmt: skip
"""CTranslate2's compute types (``ctranslate2.get_supported_compute_types`` says which a device runs)."""


def _positive(instance: Any, *names: str) -> None:
    for name in names:
        value = getattr(instance, name)
        if value is not None and value <= 0:
            raise InvalidSetting(name, f"{name} must be > 0, got {value}")


@dataclass
class ModelSettings:
    """The models and the scoring of one batch."""

    codec: str | None = field(
        default=None,
        metadata={
            "help": "codec spec: NAME:PATH or PATH; xcodec2 (XCodec2 dir or hub id) or mel_fsq (the mini codec); a "
            "bare PATH is mel_fsq when its config.json says so, else xcodec2 (maspo_base.codecs)"
        },
    )
    layout: str | None = field(
        default=None,
        metadata={
            "help": "the registered speech-token layout that reads token-id requests (llasa-1b, mini-llasa); its "
            "codebook must be the codec's. null: Llasa-1B's ids with the codec's codebook"
        },
    )
    asr: dict[str, str] | str | None = field(
        default=None,
        metadata={
            "help": "ASR per language, repeatable: zh=paraformer:paraformer-zh, en=faster_whisper:large-v3 (dir or "
            "name); in reward_kwargs a mapping {zh: 'paraformer:...'}",
            "cli": "append",
            "metavar": "LANG=BACKEND[:MODEL]",
        },
    )
    second_asr: dict[str, str] | str | None = field(
        default=None,
        metadata={
            "help": "a second ear per language, as --asr (en=pocketsphinx): requests that ask (second_ear) are heard "
            "by it too and its error rate is reported beside the reward's, never scored; in reward_kwargs a mapping",
            "cli": "append",
            "metavar": "LANG=BACKEND[:MODEL]",
        },
    )
    likelihood: dict[str, str] | str | None = field(
        default=None,
        metadata={
            "help": "Whisper model (CTranslate2 dir or faster-whisper name) per language for the recogniser's "
            "likelihood of the reference (asr_nll; the anchors' reward), repeatable: en=large-v3, zh=large-v3; "
            "shares the ASR's model when it names the same; in reward_kwargs a mapping {en: 'large-v3'}",
            "cli": "append",
            "metavar": "LANG=MODEL",
        },
    )
    ear: str | None = field(
        default=None,
        metadata={
            "help": "a built code ear's folder (maspo-verl build-ear): with reward_config.recogniser=ear it hears "
            "the codes for the score, no audio decoded; requests that ask for the second ear are decoded and heard "
            "by the ASR too (reported, never scored)"
        },
    )
    quality: str | None = field(
        default=None,
        metadata={"help": "sound-quality backend: dnsmos (speechmos' bundled DNSMOS P.835); off by default"},
    )
    device: str = field(default="cpu", metadata={"help": "cpu, cuda, cuda:1 ..."})
    dtype: Literal["float32", "bfloat16"] = field(default="float32", metadata={"help": "codec decoder compute dtype"})
    default_language: str = field(default="en", metadata={"help": "language of requests that carry none"})
    speaker: str | None = field(
        default=None,
        metadata={
            "help": "speaker-similarity backend, NAME[:CHECKPOINT]: wavlm_ecapa:/m/wavlm_large_finetune.pth "
            "(Seed-TTS-eval's WavLM-large + ECAPA-TDNN) or resemblyzer (bundled GE2E); off by default"
        },
    )
    reward_config: RewardConfig = field(
        default_factory=RewardConfig,
        metadata={"help": "RewardConfig fields, e.g. '{\"w_duration\": 0.2}'", "cli": "json"},
    )
    max_codes: int = field(
        default=DEFAULT_MAX_CODES,
        metadata={
            "help": f"responses with more speech tokens score too_long without being decoded "
            f"({DEFAULT_MAX_CODES} codes = {DEFAULT_MAX_SECONDS} s of speech)"
        },
    )
    codec_max_batch: int = field(default=16, metadata={"help": "sequences per codec forward pass"})
    codec_pad_multiple: int = field(
        default=1,
        metadata={
            "help": "decode lengths rounded up to this many tokens together (1: exact lengths only; 50: whole "
            "seconds, larger batches, slightly different audio)"
        },
    )
    asr_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "waveforms per ASR call (default: paraformer/sensevoice 1, whose output depends on batch "
            "make-up; faster_whisper 16)"
        },
    )
    num_threads: int | None = field(default=None, metadata={"help": "torch CPU threads", "flag": "--threads"})
    whisper_compute_type: WhisperComputeType | None = field(
        default=None,
        metadata={
            "help": "CTranslate2 compute type of the faster_whisper recognisers and the likelihood's Whisper "
            "(default: int8 on CPU, float16 on GPU); float32 hears noise-like audio the same in every process "
            "(int8 can flip its transcript with the input's float rounding)"
        },
    )

    def _check_ear(self) -> None:
        """The code ear scores from the codes alone: the parts that need the response's audio cannot join it."""
        config = self.reward_config
        if not self.ear:
            raise InvalidSetting("ear", "reward_config.recogniser='ear' needs ear: a built code ear's folder")
        audio_parts = {
            "likelihood": bool(self.likelihood),
            "speaker": bool(self.speaker),
            "quality": bool(self.quality) or config.w_quality > 0,
            "reward_config.frame_likelihood": config.frame_likelihood,
        }
        clash = [name for name, on in audio_parts.items() if on]
        if clash:
            raise InvalidSetting(
                clash[0].removeprefix("reward_config."),
                f"reward_config.recogniser='ear' scores the codes, no audio: {clash} read the audio; drop them "
                "(the ear gives the likelihood itself)",
            )

    def validate(self) -> None:
        _positive(self, "max_codes", "codec_max_batch", "codec_pad_multiple", "asr_batch_size", "num_threads")
        if not self.default_language.strip():
            raise InvalidSetting("default_language", "default_language is blank; give a code such as 'en' or 'zh'")
        if self.layout is not None:
            from maspo_base.speech_tokens.layouts import LAYOUTS

            if self.layout not in LAYOUTS:
                raise InvalidSetting("layout", f"layout={self.layout!r}; registered: {sorted(LAYOUTS)}")
        if self.quality is not None:
            from reward_fns.quality import QUALITY_BACKENDS

            if self.quality not in QUALITY_BACKENDS:
                raise InvalidSetting("quality", f"quality={self.quality!r}; valid: {list(QUALITY_BACKENDS)}")
        if self.second_asr is not None:
            try:
                parse_asr_spec(self.second_asr)
            except ValueError as error:
                raise InvalidSetting("second_asr", str(error)) from None
        if self.likelihood is not None:
            try:
                parse_likelihood_spec(self.likelihood)
            except ValueError as error:
                raise InvalidSetting("likelihood", str(error)) from None
        if self.whisper_compute_type is not None and self.asr is not None and not self.likelihood:
            specs = [self.asr, *([self.second_asr] if self.second_asr else [])]
            if all(backend != "faster_whisper" for spec in specs for backend, _ in parse_asr_spec(spec).values()):
                raise InvalidSetting(
                    "whisper_compute_type",
                    "whisper_compute_type is set but no Whisper runs: no faster_whisper recogniser, no likelihood",
                )
        config = self.reward_config
        if config.recogniser == "ear":
            self._check_ear()
        elif self.ear is not None:
            raise InvalidSetting(
                "ear", "ear is set but reward_config.recogniser is 'audio': set it to 'ear' or drop ear"
            )
        if config.w_quality > 0 and self.quality is None:
            raise InvalidSetting("quality", "reward_config.w_quality > 0 needs a quality backend: quality=dnsmos")
        needs_likelihood = config.intelligibility in ("anchors", "likelihood") and config.recogniser == "audio"
        if self.asr is not None and (needs_likelihood or config.frame_likelihood):
            have = set(parse_likelihood_spec(self.likelihood)) if self.likelihood else set()
            missing = sorted(set(parse_asr_spec(self.asr)) - have)
            if missing:
                why = f"intelligibility={config.intelligibility!r}" if needs_likelihood else "frame_likelihood"
                raise InvalidSetting(
                    "likelihood", f"reward_config.{why} needs a likelihood model for language(s) {missing}"
                )
        if self.speaker is not None:
            from reward_fns.speaker_similarity import parse_speaker_spec

            try:
                parse_speaker_spec(self.speaker)
            except ValueError as error:
                raise InvalidSetting("speaker", str(error)) from None


@dataclass
class BatchSettings:
    """Dynamic batching of concurrent requests."""

    max_batch: int = field(default=32, metadata={"help": "most requests scored in one batch"})
    max_wait_ms: float = field(default=20.0, metadata={"help": "longest wait for a batch to fill"})
    max_queue: int = field(
        default=1024,
        metadata={
            "help": "requests waiting to be batched: the server answers 503 beyond it (a /score_batch wider than "
            "it: 413); in process, callers wait for room; on Serve, the requests one caller has in flight (the "
            "HTTP ingress answers 503 beyond it, a handle caller waits)"
        },
    )

    def validate(self) -> None:
        _positive(self, "max_batch", "max_queue")
        if self.max_wait_ms < 0:
            raise InvalidSetting("max_wait_ms", f"max_wait_ms must be >= 0, got {self.max_wait_ms}")


@dataclass
class ClientSettings:
    """The veRL side of the reward server."""

    server_url: str | None = None
    client_timeout_s: float = 600.0
    client_retries: int = 3
    client_backoff_s: float = 1.0

    def validate(self) -> None:
        _positive(self, "client_timeout_s")
        for name in ("client_retries", "client_backoff_s"):
            if getattr(self, name) < 0:
                raise InvalidSetting(name, f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass
class ServerSettings:
    """What only the server process has."""

    host: str = field(default="127.0.0.1", metadata={"help": "address to bind"})
    port: int = field(default=8765, metadata={"help": "port to bind"})
    request_timeout_s: float = field(
        default=300.0,
        metadata={
            "help": "a request still waiting in the queue after this long is dropped unscored and gets 504 "
            "(one already being scored is finished)"
        },
    )
    max_body_mb: float = field(
        default=DEFAULT_MAX_BODY_MB, metadata={"help": "request bodies larger than this many MiB get 413"}
    )
    log_level: str = field(default="info", metadata={"help": "uvicorn and server log level"})

    def validate(self) -> None:
        _positive(self, "request_timeout_s", "max_body_mb")
        if not 0 <= self.port < 65536:
            raise InvalidSetting("port", f"port must be in [0, 65536), got {self.port}")


@dataclass
class ServeSettings:
    """The reward as a Ray Serve application in the trainer's Ray cluster (`reward_fns.ray_serve`)."""

    serve_app: str | None = field(
        default=None,
        metadata={
            "help": "name of the Serve application of the speech reward; set, the reward is scored there: veRL's "
            "reward function deploys it on first use when codec and asr are given too, else attaches to it running"
        },
    )
    serve_replicas: int = field(default=1, metadata={"help": "replicas of the scorer (without autoscaling)"})
    serve_min_replicas: int | None = field(
        default=None, metadata={"help": "autoscaling: fewest replicas (set with serve_max_replicas)"}
    )
    serve_max_replicas: int | None = field(
        default=None, metadata={"help": "autoscaling: most replicas; set, Serve scales between the bounds"}
    )
    serve_gpus: float = field(default=0.0, metadata={"help": "GPUs per replica (fractions share one GPU)"})
    serve_cpus: float = field(default=1.0, metadata={"help": "CPUs per replica"})
    serve_resources: dict[str, float] | None = field(
        default=None,
        metadata={
            "help": "custom Ray resources per replica, e.g. '{\"speech_reward\": 1}' to place the replicas on the "
            "nodes started with ray start --resources='{\"speech_reward\": 8}'",
            "cli": "json",
        },
    )
    serve_max_ongoing: int | None = field(
        default=None,
        metadata={
            "help": "requests one replica holds at once, batching and scoring (Serve's max_ongoing_requests; "
            "default 2 * max_batch: the next batch gathers while one is scored)"
        },
    )
    serve_retries: int = field(
        default=3,
        metadata={
            "help": "times a response is sent again after its replica died under it; then it scores "
            "invalid_score with speech_reason=reward_unavailable"
        },
    )
    serve_timeout_s: float = field(
        default=600.0,
        metadata={
            "help": "longest a response is re-sent while every caller queue is full (max_queue per caller); then "
            "reward_unavailable"
        },
    )

    def validate(self) -> None:
        _positive(self, "serve_replicas", "serve_min_replicas", "serve_max_replicas", "serve_max_ongoing")
        _positive(self, "serve_timeout_s")
        for name in ("serve_gpus", "serve_cpus", "serve_retries"):
            if getattr(self, name) < 0:
                raise InvalidSetting(name, f"{name} must be >= 0, got {getattr(self, name)}")
        for name, amount in (self.serve_resources or {}).items():
            if amount < 0:
                raise InvalidSetting("serve_resources", f"serve_resources.{name} must be >= 0, got {amount}")
        if self.serve_app is not None and not self.serve_app.strip():
            raise InvalidSetting("serve_app", "serve_app is blank; give the Serve application's name or omit it")
        lo, hi = self.serve_min_replicas, self.serve_max_replicas
        if (lo is None) != (hi is None):
            raise InvalidSetting(
                "serve_max_replicas", "autoscaling needs both serve_min_replicas and serve_max_replicas"
            )
        if lo is not None and lo > hi:
            raise InvalidSetting("serve_min_replicas", f"serve_min_replicas={lo} > serve_max_replicas={hi}")


IN_PROCESS_SETTINGS = (ModelSettings, BatchSettings)
"""The ``reward_kwargs`` of the in-process reward (`reward_fns.verl_reward`)."""
REMOTE_SETTINGS = (ClientSettings, ServeSettings)
"""The ``reward_kwargs`` of the reward served elsewhere (``server_url``, ``serve_app``)."""
SERVER_SETTINGS = (ModelSettings, BatchSettings, ServerSettings)
"""The flags of ``maspo-verl reward-server`` (`reward_fns.http_server`)."""


def field_names(*classes: type) -> list[str]:
    return [f.name for cls in classes for f in dataclasses.fields(cls)]


def split(
    values: dict[str, Any], classes: tuple[type, ...], key: str, read_elsewhere: tuple[str, ...] = ()
) -> list[Any]:
    """One settings instance per class from one flat mapping; a key of none of them is rejected naming every valid
    key: the classes' fields and ``read_elsewhere``, the keys the caller reads itself (not split here)."""
    valid = sorted({*field_names(*classes), *read_elsewhere})
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise SettingsError(f"{key}: unknown key(s) {unknown}; valid keys: {valid}")
    return [
        build(cls, {f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values}, key)
        for cls in classes
    ]


def parse_asr_spec(spec: str | Mapping[str, str]) -> dict[str, tuple[str, str | None]]:
    """``{"zh": "paraformer:paraformer-zh", "en": "faster_whisper:/models/large-v3"}`` or the same as one string
    ``"zh=paraformer:paraformer-zh;en=faster_whisper:/models/large-v3"`` -> ``{lang: (backend, model)}``."""
    from reward_fns.asr import get_asr_backend_cls
    from reward_fns.text_norm import base_language

    if isinstance(spec, str):
        items = [part.split("=", 1) for part in spec.replace(",", ";").split(";") if part.strip()]
        if any(len(item) != 2 for item in items):
            raise ValueError(
                f"asr spec {spec!r}: expected 'lang=backend[:model];...', e.g. 'zh=paraformer:paraformer-zh'"
            )
        spec = {lang.strip(): value.strip() for lang, value in items}
    out = {}
    for lang, value in spec.items():
        backend, _, model = str(value).partition(":")
        get_asr_backend_cls(backend)  # raises with the registered names
        out[base_language(lang)] = (backend, model or None)
    if not out:
        raise ValueError("asr spec names no language; e.g. 'en=faster_whisper:large-v3'")
    return out


def parse_likelihood_spec(spec: str | Mapping[str, str]) -> dict[str, str]:
    """``{"en": "large-v3", "zh": "/m/v3"}`` or ``"en=large-v3;zh=/m/v3"`` -> ``{lang: model}``."""
    from reward_fns.text_norm import base_language

    if isinstance(spec, str):
        items = [part.split("=", 1) for part in spec.replace(",", ";").split(";") if part.strip()]
        if any(len(item) != 2 or not item[1].strip() for item in items):
            raise ValueError(f"likelihood spec {spec!r}: expected 'lang=model;...', e.g. 'en=large-v3'")
        spec = {lang.strip(): value.strip() for lang, value in items}
    out = {base_language(lang): str(model) for lang, model in spec.items()}
    if not out:
        raise ValueError("likelihood spec names no language; e.g. 'en=large-v3'")
    return out
