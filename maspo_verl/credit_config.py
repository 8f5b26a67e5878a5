"""Typed settings of segment credit (``adv_estimator=maspo``, the ``algorithm.maspo`` block), validated in the
driver before Ray (`validate_algorithm_config`, run by the trainer patch). Formula and defaults: docs/credit.md."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from maspo_base.frame_errors import CREDIT_SOURCE_KEYS
from maspo_base.typed_settings import InvalidSetting
from maspo_verl.config import CodecConfig, _build

CREDIT_ESTIMATOR = "maspo"
"""``algorithm.adv_estimator`` of segment credit (`maspo_verl.advantage`); its settings are ``algorithm.maspo``."""
CREDIT_CONFIG_KEY = "algorithm.maspo"


@dataclass
class CreditConfig:
    """``algorithm.maspo``: settings of ``adv_estimator=maspo``. Formula and defaults: docs/credit.md."""

    credit_weight: float = 0.5
    """lambda: a frame's credit is ``lambda * u_g * (mean frame error of its response - its error)``."""
    credit_source: Literal["errors", "likelihood"] = "errors"
    """Which per-frame signal places the credit: ``errors`` (binary, frames the recogniser heard wrong) or
    ``likelihood`` (``1 - p(word)`` of the reference word aligned to the frame); `frame_errors.CREDIT_SOURCE_KEYS`."""
    credit_mode: Literal["redistribute", "per_unit"] = "redistribute"
    """``redistribute``: GRPO's advantage moved inside each response from its erring frames to its right ones (the
    credit sums to zero over the response); ``per_unit``: each unit the recogniser aligned to the target (the code
    ear's phonemes, reported in ``frame_words``) gets its own group-relative advantage, as W3AR does per word."""
    error_key: str | None = None
    """The reward's extra key holding each response's per-frame signal (`maspo_base.frame_errors`); default: the
    credit source's key (``frame_errors`` / ``frame_likelihood``)."""
    codec: CodecConfig = field(default_factory=CodecConfig)
    """Which response tokens are codec frames: frame k of the signal is the k-th codec token of the response."""

    def __post_init__(self) -> None:
        if self.error_key is None and self.credit_source in CREDIT_SOURCE_KEYS:
            self.error_key = CREDIT_SOURCE_KEYS[self.credit_source]

    def validate(self) -> None:
        if self.credit_weight < 0:
            raise InvalidSetting("credit_weight", f"credit_weight must be >= 0, got {self.credit_weight}")
        if not self.error_key:
            raise InvalidSetting("error_key", "error_key must be a non-empty string")

    @classmethod
    def from_mapping(
        cls, values: Mapping | None, key: str = CREDIT_CONFIG_KEY, check_tokenizer: bool = True
    ) -> CreditConfig:
        """Build and validate from a (Hydra) mapping; every error names the full key and what is valid.

        ``check_tokenizer``: load ``codec.tokenizer`` (when set) and check the codec offset against it."""
        config = _build(cls, values, key)
        if check_tokenizer:
            config.codec.check_tokenizer(f"{key}.codec")
        return config


def credit_settings(algorithm: Any, check_tokenizer: bool = False) -> CreditConfig:
    """The segment-credit settings of veRL's ``algorithm`` config (defaults when it has no ``maspo`` block)."""
    block = algorithm.get("maspo", None) if algorithm is not None else None
    if isinstance(block, CreditConfig):
        return block
    return CreditConfig.from_mapping(block, check_tokenizer=check_tokenizer)


def validate_algorithm_config(config: Any) -> None:
    """Check ``algorithm.maspo`` of a whole veRL config (run in the driver, before Ray; `maspo_verl.verl_patches`)."""
    algorithm = config.get("algorithm", None)
    if algorithm is None:
        return
    if algorithm.get("adv_estimator", None) == CREDIT_ESTIMATOR or algorithm.get("maspo", None) is not None:
        credit_settings(algorithm, check_tokenizer=True)
