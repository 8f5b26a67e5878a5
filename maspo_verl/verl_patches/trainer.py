"""Trainer side: the reward's frame errors into ``adv_estimator=maspo``, its heard words into the actor's batch, and
``algorithm.maspo`` checked early.

In the process that computes advantages:

- veRL's ``compute_advantage`` (``verl.trainer.ppo.ray_trainer``, also bound in ``verl.trainer.ppo.v1.utils``) is
  wrapped: it reads each response's encoded frame errors (the reward extra ``algorithm.maspo.error_key``) and the
  response token ids, places frame k on the k-th codec token of the response (`scatter_frame_errors`) and provides
  them to the estimator (`maspo_verl.advantage_inputs`). The legacy trainer has both in the batch
  (``non_tensor_batch`` and ``responses``); the default (v1) trainer's ``PPOTrainer._compute_advantage`` reads only
  a few fields from its TransferQueue, so it is wrapped to fetch ``responses`` and ``extra_fields``
  (``reward_extra_info``) for the same keys. The KL penalty (``use_kl_in_reward``) changes only
  ``token_level_rewards``, never this channel.
- The estimator's metrics reach the step's log: through ``PPOTrainer._compute_advantage``'s ``metrics`` (v1) and
  through ``compute_data_metrics`` (legacy, `maspo_verl.verl_patches.metrics`).
- A trainer's ``_update_actor`` (legacy ``RayPPOTrainer``, v1 ``PPOTrainer``) is wrapped for a segmenter that
  needs heard words (``heard_words``): it places each response's ``frame_words`` (the reward extra,
  `maspo_base.frame_words`) on its codec tokens, frame k on the k-th codec token
  (`maspo_verl.verl_patches.reward_signals.heard_words_on_tokens`), and adds the ``(B, T)`` result to the batch as
  `HEARD_WORDS_FIELD`: a tensor of the legacy batch, a field of the v1 trainer's TransferQueue (which hands the actor
  every field). The actor's micro-batches carry it to the loss (`maspo_verl.verl_patches.actor`). Responses without
  alignment are counted (``maspo_heard/unaligned_samples``).
- ``verl.utils.config.validate_config`` (run by ``main_ppo`` in the driver, before Ray) also fills the codec blocks
  with the layout the model's checkpoint declares (`maspo_verl.model_layout`), checks ``algorithm.maspo``, the
  speech reward's backend (`maspo_base.reward_backend`), and that a run whose segmenter needs heard words (the
  loss's, or a decoupled rollout correction's) has a reward that reports them.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import importlib
import os
from typing import Any

import torch

from maspo_base.frame_errors import scatter_frame_errors
from maspo_base.frame_words import FRAME_WORDS_KEY, scatter_frame_words
from maspo_base.reward_backend import reward_backend
from maspo_verl.advantage_inputs import CreditInputs, provide_credit_inputs
from maspo_verl.config import CONFIG_KEY, MaspoConfig, MaspoConfigError, SegmenterConfig
from maspo_verl.credit_config import CREDIT_ESTIMATOR, credit_settings, validate_algorithm_config
from maspo_verl.model_layout import fill_model_layout
from maspo_verl.policy_loss_shorthand import normalize_policy_loss
from maspo_verl.rollout_correction import uses_segments
from maspo_verl.rollout_correction_config import (
    ROLLOUT_CORRECTION_KEY,
    correction_segmenter,
    prepare_rollout_correction,
)
from maspo_verl.verl_patches.actor import HEARD_WORDS_FIELD
from maspo_verl.verl_patches.reward_signals import heard_words_on_tokens, v1_signals
from maspo_verl.verl_patches.rollout_correction import fetch_responses, fetched_responses

CREDIT_TRACE_ENV = "MASPO_VERL_CREDIT_TRACE"
"""If set, a file path: each maspo advantage call appends one JSON line per response (token ids, frame errors as
placed, advantages), to check the alignment (the end-to-end tests do)."""

_pending_credit_metrics: dict[str, float] = {}
_v1_credit_fields: contextvars.ContextVar[dict | None] = contextvars.ContextVar("maspo_v1_credit_fields", default=None)


def _is_credit_estimator(adv_estimator: Any) -> bool:
    return getattr(adv_estimator, "value", adv_estimator) == CREDIT_ESTIMATOR


def credit_inputs_for(
    responses: torch.Tensor, response_mask: torch.Tensor, signals: Any, settings: Any, unit_signals: Any = None
):
    """`CreditInputs` of a padded batch: frame tokens are the codec ids of the valid response tokens. With
    ``credit_mode=per_unit`` each frame's unit comes from ``unit_signals`` (the reward's ``frame_words``); a response
    is aligned when both its signals are."""
    _, is_speech = settings.codec.speech_tokens.codec_ids(responses)
    frame_mask = is_speech & response_mask.to(torch.bool)
    if signals is None:
        signals = [None] * responses.shape[0]
    errors, aligned = scatter_frame_errors(list(signals), frame_mask)
    units = None
    if settings.credit_mode == "per_unit":
        if unit_signals is None:
            unit_signals = [None] * responses.shape[0]
        units, units_aligned = scatter_frame_words(list(unit_signals), frame_mask)
        aligned = aligned & units_aligned
    return CreditInputs(frame_errors=errors, frame_mask=frame_mask, aligned=aligned, frame_units=units)


def _write_credit_trace(path: str, data: Any, responses: torch.Tensor, inputs: Any) -> None:
    import json

    response_mask = data.batch["response_mask"]
    scores = data.batch["token_level_rewards"].sum(dim=-1)
    rows = []
    for i in range(responses.shape[0]):
        valid = response_mask[i].to(torch.bool)
        rows.append(
            {
                "uid": str(data.non_tensor_batch["uid"][i]),
                "score": float(scores[i]),
                "responses": responses[i, : valid.shape[0]][valid].tolist(),
                "frame_mask": inputs.frame_mask[i][valid].tolist(),
                "frame_errors": inputs.frame_errors[i][valid].tolist(),
                "aligned": bool(inputs.aligned[i]),
                "advantages": data.batch["advantages"][i][valid].tolist(),
            }
        )
    with open(path, "a") as handle:
        handle.write(json.dumps({"rows": rows, "metrics": inputs.metrics}) + "\n")


def wrap_compute_advantage(compute_advantage):
    """Wrap veRL's ``compute_advantage(data, adv_estimator, ...)`` to provide MASPO's credit inputs."""

    @functools.wraps(compute_advantage)
    def compute_advantage_with_maspo_credit(data, adv_estimator, *args, **kwargs):
        if not _is_credit_estimator(adv_estimator):
            return compute_advantage(data, adv_estimator, *args, **kwargs)
        settings = credit_settings(kwargs.get("config"))
        v1_fields = _v1_credit_fields.get() or {}
        if "responses" in data.batch.keys():
            responses = data.batch["responses"]
            signals = data.non_tensor_batch.get(settings.error_key)
            unit_signals = data.non_tensor_batch.get(FRAME_WORDS_KEY)
        else:
            responses = v1_fields.get("responses")
            signals, unit_signals = v1_fields.get("signals"), v1_fields.get("unit_signals")
        if "response_mask" not in data.batch.keys():
            from verl.trainer.ppo.ray_trainer import compute_response_mask

            data.batch["response_mask"] = compute_response_mask(data)
        response_mask = data.batch["response_mask"]
        if responses is None:
            raise RuntimeError("adv_estimator=maspo: the batch holds no `responses` to place frame errors on")
        inputs = credit_inputs_for(
            responses[:, : response_mask.shape[1]], response_mask, signals, settings, unit_signals
        )
        with provide_credit_inputs(inputs):
            data = compute_advantage(data, adv_estimator, *args, **kwargs)
        _pending_credit_metrics.update(inputs.metrics)
        trace = os.environ.get(CREDIT_TRACE_ENV)
        if trace:
            _write_credit_trace(trace, data, responses, inputs)
        return data

    return compute_advantage_with_maspo_credit


def pop_credit_metrics() -> dict[str, float]:
    """The metrics of the last maspo advantage call (once)."""
    metrics = dict(_pending_credit_metrics)
    _pending_credit_metrics.clear()
    return metrics


def wrap_v1_compute_advantage(method):
    """Wrap v1 ``PPOTrainer._compute_advantage(self, batch, metrics)``: fetch responses and frame errors for the
    batch's keys from the TransferQueue, and log the estimator's metrics."""

    @functools.wraps(method)
    def compute_advantage_with_maspo_fields(self, batch, metrics):
        # a segment-level rollout correction whose segmenter reads token ids gets them fetched here too
        with fetched_responses(self, batch) as responses:
            if not _is_credit_estimator(self.config.algorithm.adv_estimator):
                return method(self, batch, metrics)
            return _v1_compute_advantage_with_credit(method, self, batch, metrics, responses)

    return compute_advantage_with_maspo_fields


def _v1_compute_advantage_with_credit(method, self, batch, metrics, responses: torch.Tensor | None = None):
    """The v1 ``_compute_advantage`` of ``adv_estimator=maspo``: responses (unless fetched already) and frame
    errors fetched for it."""
    settings = credit_settings(self.config.algorithm)
    if responses is None:
        responses = fetch_responses(batch)
    fields = {"responses": responses, "signals": v1_signals(batch, settings.error_key)}
    if settings.credit_mode == "per_unit":
        fields["unit_signals"] = v1_signals(batch, FRAME_WORDS_KEY)
    token = _v1_credit_fields.set(fields)
    try:
        result = method(self, batch, metrics)
    finally:
        _v1_credit_fields.reset(token)
    metrics.update(pop_credit_metrics())
    return result


def wrap_validate_config(validate_config):
    """``main_ppo``'s config check, run in the driver before Ray: first the policy loss's shorthand is expanded
    (`maspo_verl.policy_loss_shorthand.normalize_policy_loss`; the workers receive the full block) and the codec
    blocks get the layout the model's checkpoint declares (`maspo_verl.model_layout.fill_model_layout`), then veRL's
    checks run, plus ``algorithm.maspo``, ``algorithm.rollout_correction``
    (`maspo_verl.rollout_correction_config.prepare_rollout_correction`) and the listening page's
    ``trainer.samples``."""

    @functools.wraps(validate_config)
    def validate_config_with_credit(config, *args, **kwargs):
        from maspo_verl.listening import sample_settings

        normalize_policy_loss(config)
        fill_model_layout(config)
        validate_algorithm_config(config)
        prepare_rollout_correction(config)
        check_speech_reward(config)
        check_heard_words_reward(config)
        sample_settings(config)
        return validate_config(config, *args, **kwargs)

    return validate_config_with_credit


def wrap_dump_generations(method):
    """Wrap a trainer's ``_dump_generations(self, inputs, outputs, gts, scores, reward_extra_infos_dict,
    dump_path)`` (both trainers; validation and rollout dumps): after veRL's JSONL, the listening page's samples
    (`maspo_verl.listening`)."""

    @functools.wraps(method)
    def dump_generations_with_samples(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path):
        result = method(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path)
        from maspo_verl.listening import after_dump

        after_dump(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path)
        return result

    return dump_generations_with_samples


# ----------------------------------------------------------------------------------------------------------------
# Heard words: the reward's frame_words on the response tokens, in the batch the actor trains on

SPEECH_REWARD_MODULE = "reward_fns.verl_reward"
"""The speech reward's veRL entry (`reward_fns.verl_reward`): its ``reward_config.frame_words`` can be checked."""


def _segmenter_block(policy_loss: Any) -> tuple[str | None, list]:
    """The segmenter name and ``segmenter_modules`` of a ``policy_loss`` block (a Hydra mapping), without building
    the settings; ``(None, [])`` unless the loss is MASPO."""
    if policy_loss is None or isinstance(policy_loss, str) or policy_loss.get("loss_mode", None) != "maspo":
        return None, []
    block = policy_loss.get("maspo", None) or {}
    if isinstance(block, MaspoConfig):
        return block.segmenter.name, list(block.segmenter_modules)
    segmenter = block.get("segmenter", None) or {}
    name = segmenter if isinstance(segmenter, str) else segmenter.get("name", SegmenterConfig.name)
    return name, list(block.get("segmenter_modules", None) or [])


def needs_heard_words(policy_loss: Any) -> bool:
    """Whether a ``policy_loss`` block selects MASPO with a segmenter registered with ``needs_heard_words``."""
    from maspo_verl.segmentation import SEGMENTER_REGISTRY

    name, modules = _segmenter_block(policy_loss)
    if name is None:
        return False
    try:
        for module in modules:
            importlib.import_module(module)
    except ImportError:
        return False  # building the MASPO settings reports it, naming segmenter_modules
    return name in SEGMENTER_REGISTRY and SEGMENTER_REGISTRY[name].needs_heard_words


def _reward_function(config: Any) -> tuple[str, Any]:
    """``(key, block)`` of the run's custom reward function: ``reward.custom_reward_function``, or veRL's legacy
    top-level ``custom_reward_function`` (which veRL moves there)."""
    reward = config.get("reward", None)
    block = reward.get("custom_reward_function", None) if reward is not None else None
    if block is not None and block.get("path", None):
        return "reward.custom_reward_function", block
    legacy = config.get("custom_reward_function", None)
    if legacy is not None and legacy.get("path", None):
        return "custom_reward_function", legacy
    return "reward.custom_reward_function", block


def _is_speech_reward(path: Any) -> bool:
    return SPEECH_REWARD_MODULE in str(path).replace("/", ".").removesuffix(".py")


def check_speech_reward(config: Any) -> None:
    """In the driver, before Ray: every ``reward_kwargs`` value a config group leaves mandatory (``???``, e.g.
    ``speech_reward=server``'s ``server_url``) is given (veRL would pass the literal ``???`` to the reward); for the
    speech reward, its backend is the one ``reward_kwargs.backend`` names, no key of another backend is set and the
    keys it needs are (`maspo_base.reward_backend`), each error naming the keys."""
    from omegaconf import DictConfig, OmegaConf

    key, block = _reward_function(config)
    kwargs = block.get("reward_kwargs", None) if block is not None else None
    if isinstance(kwargs, DictConfig):
        missing = [name for name in kwargs if OmegaConf.is_missing(kwargs, name)]
        if missing:
            raise MaspoConfigError(
                f"{key}.reward_kwargs.{missing[0]} is not set: the reward backend chosen needs it (e.g. speech_reward="
                f"server needs {key}.reward_kwargs.server_url=http://HOST:8765; docs/reward.md)"
            )
    if block is None or not _is_speech_reward(block.get("path", None)):
        return
    try:
        backend = reward_backend(kwargs, f"{key}.reward_kwargs")
    except ValueError as error:
        raise MaspoConfigError(str(error)) from None
    missing = backend.missing(kwargs)
    if missing:
        raise MaspoConfigError(
            f"{key}.reward_kwargs.{missing[0]} is not set: the speech reward's backend {backend.name!r} needs "
            f"{missing}. Choose where it runs: speech_reward=server with {key}.reward_kwargs.server_url, "
            f"speech_reward=serve, or speech_reward=in_process with {key}.reward_kwargs.codec and .asr.<language> "
            "(in process on a GPU run the reward's models run on veRL's reward workers' CPUs: docs/reward.md)"
        )


def _frame_words_user(config: Any) -> str | None:
    """What in the run reads the reward's ``frame_words``, said as the start of a message (None: nothing does)."""
    actor = config.get("actor_rollout_ref", {}).get("actor", {})
    policy_loss = actor.get("policy_loss", None)
    if needs_heard_words(policy_loss):
        name, _ = _segmenter_block(policy_loss)
        return f"{CONFIG_KEY}.segmenter.name={name} cuts responses at the words the recogniser heard"
    algorithm = config.get("algorithm", None)
    if algorithm is not None and _is_credit_estimator(algorithm.get("adv_estimator", None)):
        if credit_settings(algorithm).credit_mode == "per_unit":
            return "algorithm.maspo.credit_mode=per_unit credits the units the recogniser aligned (frame_words)"
    return _correction_frame_words_user(algorithm)


def _correction_frame_words_user(algorithm: Any) -> str | None:
    """A decoupled segment-level rollout correction whose segmenter needs heard words, said as `_frame_words_user`
    says it (bypass mode corrects over the loss's segments, checked with the loss)."""
    block = algorithm.get("rollout_correction", None) if algorithm is not None else None
    if not uses_segments(block) or block.get("bypass_mode", False):
        return None
    segmenter = correction_segmenter(block)
    if not segmenter.needs_heard_words:
        return None
    return f"{ROLLOUT_CORRECTION_KEY}.segmenter.name={segmenter.name} cuts the correction's segments at the words heard"


def check_heard_words_reward(config: Any) -> None:
    """In the driver, before Ray: a run whose segmenter needs heard words, or whose credit is per unit, has a reward
    that reports ``frame_words``.

    The speech reward in process (or deployed on Serve by this run) must have ``reward_config.frame_words=true``; a
    run without a custom reward function (veRL's own scorers report none) is refused. A speech reward served
    elsewhere (``server_url``, or a Serve application this run attaches to) is configured by its own flags, and any
    other reward function may report ``frame_words`` itself: both pass, and responses without them are counted in
    ``maspo_heard/unaligned_samples``."""
    user = _frame_words_user(config)
    if user is None:
        return
    key, block = _reward_function(config)
    path = block.get("path", None) if block is not None else None
    if not path:
        raise MaspoConfigError(
            f"{user}, but {key}.path is not set (veRL's "
            f"own scorers report no frame_words): use the speech reward, {key}.path=pkg://{SPEECH_REWARD_MODULE} "
            f"with {key}.reward_kwargs.reward_config.frame_words=true"
        )
    if not _is_speech_reward(path):
        return
    kwargs = block.get("reward_kwargs", None) or {}
    reward_config = kwargs.get("reward_config", None) or {}
    if reward_backend(kwargs).models_here and reward_config.get("frame_words", False) is not True:
        raise MaspoConfigError(
            f"{user}, but the speech reward does not "
            f"report them: set {key}.reward_kwargs.reward_config.frame_words=true (got "
            f"{reward_config.get('frame_words', None)!r})"
        )


def _heard_words_layout(trainer: Any) -> Any:
    """The speech-token layout of the actor's MASPO settings when its segmenter needs heard words, else None
    (worked out once per trainer)."""
    cached = trainer.__dict__.get("_maspo_heard_words_layout", ...)
    if cached is ...:
        policy_loss = trainer.config.actor_rollout_ref.actor.get("policy_loss", None)
        cached = None
        if needs_heard_words(policy_loss):
            block = policy_loss.get("maspo", None)
            settings = block if isinstance(block, MaspoConfig) else MaspoConfig.from_mapping(block)
            cached = settings.codec.speech_tokens
        trainer.__dict__["_maspo_heard_words_layout"] = cached
    return cached


def wrap_legacy_update_actor(method):
    """Wrap the legacy ``RayPPOTrainer._update_actor(self, batch)``: the batch gains `HEARD_WORDS_FIELD` from its
    ``responses`` and the reward's ``frame_words`` (``non_tensor_batch``); the metrics join the actor's."""

    @functools.wraps(method)
    def update_actor_with_heard_words(self, batch):
        layout = _heard_words_layout(self)
        if layout is None:
            return method(self, batch)
        responses = batch.batch["responses"]
        if "response_mask" in batch.batch.keys():
            response_mask = batch.batch["response_mask"]
        else:
            from verl.trainer.ppo.ray_trainer import compute_response_mask

            response_mask = compute_response_mask(batch)
        signals = batch.non_tensor_batch.get(FRAME_WORDS_KEY)
        words, metrics = heard_words_on_tokens(responses, response_mask, signals, layout)
        batch.batch[HEARD_WORDS_FIELD] = words
        output = method(self, batch)
        output.meta_info["metrics"].update(metrics)
        return output

    return update_actor_with_heard_words


def wrap_v1_update_actor(method):
    """Wrap v1 ``PPOTrainer._update_actor(self, batch, metrics)``: `HEARD_WORDS_FIELD` is written to the
    TransferQueue for the batch's keys (nested, each response's own length) and named in the batch's fields, so the
    actor worker receives it; the metrics join the step's."""

    @functools.wraps(method)
    def update_actor_with_heard_words(self, batch, metrics):
        layout = _heard_words_layout(self)
        if layout is None:
            return method(self, batch, metrics)
        import transfer_queue as tq
        from tensordict import TensorDict
        from verl.workers.utils.padding import response_to_nested

        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["responses", "response_mask"]
        )
        nested_mask = data["response_mask"]
        responses = data["responses"].to_padded_tensor(0) if data["responses"].is_nested else data["responses"]
        response_mask = nested_mask.to_padded_tensor(0) if nested_mask.is_nested else nested_mask
        counted = torch.tensor([not tag.get("is_padding", False) for tag in batch.tags], dtype=torch.bool)
        signals = v1_signals(batch, FRAME_WORDS_KEY)
        words, heard_metrics = heard_words_on_tokens(responses, response_mask, signals, layout, counted)
        if nested_mask.is_nested:
            words = response_to_nested(words, nested_mask)
        put = tq.kv_batch_put(
            keys=batch.keys,
            partition_id=batch.partition_id,
            fields=TensorDict({HEARD_WORDS_FIELD: words}, batch_size=len(batch.keys)),
        )
        batch = dataclasses.replace(batch, fields=put.fields)  # its tags and extra_info kept
        metrics.update(heard_metrics)
        return method(self, batch, metrics)

    return update_actor_with_heard_words
