"""``maspo-verl reward-serve``: the speech reward as a Ray Serve application, replicas of `SpeechReward` in a Ray
cluster (veRL's own, or one the trainer joins), reached by deployment handle in the cluster or over HTTP outside it.

- `SpeechScorer`, the deployment: one `SpeechReward` per replica (``serve_replicas`` of them, or autoscaling between
  ``serve_min_replicas`` and ``serve_max_replicas``; ``serve_gpus`` and ``serve_cpus`` each). ``score(request)``
  joins a ``@serve.batch`` of at most ``max_batch`` requests gathered for ``max_wait_ms``; the batch runs in a
  thread, so the replica keeps accepting requests and answering Serve's health checks while it scores.
- `RewardIngress`, for a client outside the cluster: the reward server's HTTP contract (`reward_fns.http_server`:
  ``/score``, ``/score_batch``, ``/health``, ``/stats``, 422/413/503/504, ``Idempotency-Key``) in front of the
  scorer; `reward_fns.client.RewardClient` talks to it as to ``maspo-verl reward-server``.
- `ServeRewardClient`, what veRL's reward function (`verl_reward`, ``serve_app`` set) awaits per response.

Where each guarantee of the home-made server comes from here:

- One bad sample scored alone: `SpeechReward.score_batch` isolates every per-sample stage; a batch that still raises
  is rerun one by one (`batching.run_isolated`, kept: ``@serve.batch`` hands a raising batch's exception to every
  request in it), and an exception reaches only the request that raises alone.
- Batched = one by one at batch size 1: the scorer pins its thread count (`SpeechReward`), as in process.
- Bounded queue, clear refusal: Serve bounds each replica at ``serve_max_ongoing`` requests (batching and scoring),
  and each caller at ``max_queued_requests`` (``max_queue``) waiting ones, beyond which it raises
  ``BackPressureError``. That caller bound is soft: Serve checks it before it counts a request, so a burst overshoots
  it (docs/reward-serve.md). The home-made queue's piece kept is exact admission counting where requests enter:
  the ingress refuses what would take it past ``max_queue`` in flight with 503 (all of a ``/score_batch`` or none;
  counted in ``/stats`` ``refused``), and `ServeRewardClient` lets at most ``max_queue`` of its caller's requests
  into Serve at once, the others waiting for room (back-pressure, as the in-process reward does). At most
  ``(callers + 1) * max_queue`` requests are in Serve, at most ``replicas * serve_max_ongoing`` on replicas.
- A replica that dies: Serve's controller starts a new one; Serve does not resend a request that was running on
  it. The client does, ``serve_retries`` times (any live replica), then scores it ``invalid_score`` with
  ``speech_reason="reward_unavailable"``: one result per response, never a crashed step. (The HTTP client,
  `RewardClient`, keeps its contract: after its retries it raises.)
- Not kept from the server: a request that timed out in the queue (504) was never scored there; here the ingress
  cancels it at ``request_timeout_s`` whether it waited or was being scored (a retry may score it again).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from typing import Any

import ray
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from maspo_base.typed_settings import SettingsError, add_arguments, build, parse_arguments
from reward_fns.batching import QueueFullError, QueueTimeoutError, run_isolated
from reward_fns.reward_settings import (
    BatchSettings,
    ModelSettings,
    ServerSettings,
    ServeSettings,
)
from reward_fns.score_record import RecordShape, unscored_record

logger = logging.getLogger(__name__)

SCORER = "SpeechScorer"
DEFAULT_APP = "speech_reward"
QUIET = {"enable_access_log": False, "log_level": "WARNING"}  # no line per request from the replicas
REPLICA_LOST = (ActorDiedError, ActorUnavailableError, RayActorError, DeploymentUnavailableError)
"""Errors of a request whose replica died or could not be reached: nothing came back, so it is sent again."""


class SpeechScorer:
    """One replica: the models of `ModelSettings`, batching by ``@serve.batch`` (module docstring)."""

    def __init__(self, model: dict[str, Any], max_batch: int, max_wait_s: float):
        from reward_fns.pipeline import SpeechReward

        self.reward = SpeechReward.from_settings(build(ModelSettings, model, "reward settings"))
        self._batched.set_max_batch_size(max_batch)
        self._batched.set_batch_wait_timeout_s(max_wait_s)
        self.max_batch = max_batch
        self.batch_sizes: Counter[int] = Counter()
        self.busy_s, self.scoring, self.ongoing, self.most_ongoing = 0.0, 0, 0, 0

    async def score(self, request: dict[str, Any]) -> dict[str, Any]:
        """The reward dict of one request (`SpeechReward.score_batch`'s, scored in a batch with its neighbours)."""
        self.ongoing += 1
        self.most_ongoing = max(self.most_ongoing, self.ongoing)
        try:
            ok, value = await self._batched(request)
        finally:
            self.ongoing -= 1
        if not ok:
            raise value
        return value

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.02)
    async def _batched(self, requests: list[dict[str, Any]]) -> list[tuple[bool, Any]]:
        self.batch_sizes[len(requests)] += 1
        self.scoring += 1
        start = time.monotonic()
        try:
            return await asyncio.to_thread(run_isolated, self.reward.score_batch, requests)
        finally:
            self.busy_s += time.monotonic() - start
            self.scoring -= 1

    def record_shape(self) -> dict[str, Any]:
        return dataclasses.asdict(self.reward.record_shape())

    def stats(self) -> dict[str, Any]:
        """This replica's counters (a call lands on any one replica)."""
        items = sum(size * n for size, n in self.batch_sizes.items())
        return {
            "replica_pid": os.getpid(),
            "batches": sum(self.batch_sizes.values()),
            "items": items,
            "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
            "busy_s": self.busy_s,
            "scoring": self.scoring,
            "ongoing": self.ongoing,
            "most_ongoing": self.most_ongoing,
        }

    def health(self) -> dict[str, Any]:
        return {
            "languages": sorted(self.reward.asr),
            "default_language": self.reward.default_language,
            "max_codes": self.reward.gate.max_codes,
            "max_batch": self.max_batch,
        }


@serve.ingress()
class RewardIngress:
    """The reward server's HTTP app (`server.http_app`) with the scorer deployment behind it."""

    def __init__(self, scorer, max_queue: int, request_timeout_s: float, max_body_mb: float):
        self.scorer = scorer
        self.max_queue, self.request_timeout_s, self.max_body_mb = max_queue, request_timeout_s, max_body_mb
        self.in_flight, self.refused = 0, 0

    async def score_many(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # The bound is counted here, checked and taken with no await between: Serve's own max_queued_requests is
        # checked before the request is counted, so a burst overshoots it (docs/reward-serve.md).
        if self.in_flight + len(items) > self.max_queue:
            self.refused += 1
            raise QueueFullError(
                f"request queue is full ({self.in_flight} of max_queue={self.max_queue} in flight, {len(items)} "
                "more asked); retry later"
            )
        self.in_flight += len(items)
        responses = [self.scorer.score.remote(item) for item in items]
        try:
            return await asyncio.wait_for(asyncio.gather(*responses), self.request_timeout_s)
        except BackPressureError as exc:
            self.refused += 1
            raise QueueFullError(f"request queue is full: {exc}; retry later") from None
        except REPLICA_LOST as exc:
            raise QueueFullError(f"a reward replica was lost ({type(exc).__name__}); nothing returned, retry") from None
        except asyncio.TimeoutError:
            raise QueueTimeoutError(
                f"request not answered within request_timeout_s={self.request_timeout_s}; cancelled"
            ) from None
        finally:
            self.in_flight -= len(items)
            for response in responses:
                response.cancel()  # no-op for those answered; a failed /score_batch leaves nothing running

    async def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            **await self.scorer.health.remote(),
            "in_flight": self.in_flight,
            "max_queue": self.max_queue,
            "max_body_mb": self.max_body_mb,
        }

    async def stats(self) -> dict[str, Any]:
        return {**await self.scorer.stats.remote(), "in_flight": self.in_flight, "refused": self.refused}

    def __serve_build_asgi_app__(self):
        from reward_fns.http_server import http_app

        return http_app(self.score_many, self.health, self.stats, self.max_queue, self.max_body_mb)


def build_app(
    model: ModelSettings,
    batch: BatchSettings,
    settings: ServeSettings,
    server: ServerSettings | None = None,
):
    """The Serve application: the scorer alone (handle callers), or behind the HTTP ingress when ``server`` is given."""
    replicas: dict[str, Any] = {"num_replicas": settings.serve_replicas}
    if settings.serve_max_replicas is not None:
        replicas = {
            "autoscaling_config": {
                "min_replicas": settings.serve_min_replicas,
                "max_replicas": settings.serve_max_replicas,
                "target_ongoing_requests": batch.max_batch,
            }
        }
    scorer = serve.deployment(SpeechScorer, name=SCORER).options(
        **replicas,
        ray_actor_options={
            "num_cpus": settings.serve_cpus,
            "num_gpus": settings.serve_gpus,
            "resources": dict(settings.serve_resources or {}),
        },
        max_ongoing_requests=settings.serve_max_ongoing or 2 * batch.max_batch,
        max_queued_requests=batch.max_queue,
    )
    bound = scorer.bind(to_plain_settings(model), batch.max_batch, batch.max_wait_ms / 1000)
    if server is None:
        return bound
    ingress = serve.deployment(RewardIngress, name="RewardIngress").options(
        num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=4 * batch.max_queue
    )
    return ingress.bind(bound, batch.max_queue, server.request_timeout_s, server.max_body_mb)


def to_plain_settings(model: ModelSettings) -> dict[str, Any]:
    """``model`` as the plain mapping `build` reads back (what a replica is constructed from)."""
    return dataclasses.asdict(model)


def app_status(name: str) -> str | None:
    """The Serve application's status (``RUNNING``, ``DEPLOYING``, ...), or None when there is none by that name."""
    try:
        app = serve.status().applications.get(name)
    except Exception:  # noqa: BLE001 - Serve not started on this cluster
        return None
    return None if app is None else str(app.status.value if hasattr(app.status, "value") else app.status)


@ray.remote(num_cpus=0)
class _Deployer:
    """One per application name in the cluster (a named actor): the first caller deploys, the others find it."""

    def ensure(self, model: dict[str, Any], batch: dict[str, Any], settings: dict[str, Any]) -> str:
        app = settings["serve_app"]
        status = app_status(app)
        if status in ("RUNNING", "DEPLOYING"):
            return status
        serve.start(proxy_location="Disabled")  # in-cluster: handles only (ignored if Serve runs already)
        built = build_app(
            build(ModelSettings, model, "reward_kwargs"),
            build(BatchSettings, batch, "reward_kwargs"),
            build(ServeSettings, settings, "reward_kwargs"),
        )
        serve.run(built, name=app, route_prefix=None, logging_config=QUIET)
        return "DEPLOYED"


def ensure_app(model: ModelSettings, batch: BatchSettings, settings: ServeSettings) -> None:
    """Deploy the application ``settings.serve_app`` unless it runs already; once for all callers of the cluster."""
    app = settings.serve_app
    if app_status(app) == "RUNNING":
        return
    deployer = _Deployer.options(name=f"maspo_reward_deployer.{app}", get_if_exists=True).remote()
    ray.get(deployer.ensure.remote(dataclasses.asdict(model), dataclasses.asdict(batch), dataclasses.asdict(settings)))


class ServeRewardClient:
    """``await client.score(request)`` -> the reward dict, from the application ``app_name`` (module docstring).

    Never raises: a response its replicas could not score after ``retries`` resends (replica lost) or
    ``timeout_s`` of refusals (every queue full) gets the unscored record (`unscored_record`) with
    ``speech_reason="reward_unavailable"``; the counters say how often each happened."""

    def __init__(
        self,
        app_name: str,
        shape: RecordShape | None = None,
        retries: int = 3,
        timeout_s: float = 600.0,
        backoff_s: float = 0.2,
        max_in_flight: int = BatchSettings.max_queue,
    ):
        self.app_name, self.shape = app_name, shape
        self.retries, self.timeout_s, self.backoff_s = retries, timeout_s, backoff_s
        self.max_in_flight, self.in_flight, self.most_in_flight = max_in_flight, 0, 0
        self._room: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
        self.handle = serve.get_deployment_handle(SCORER, app_name)
        self.counts: Counter[str] = Counter()  # answered, resent (replica lost), refused (queue full), unavailable
        self.last_refusal, self.most_queued = "", 0  # Serve's message, and the most queued at this caller it reported

    async def _shape(self) -> RecordShape:
        if self.shape is None:  # attached to a running application: ask it which keys its results carry
            try:
                self.shape = RecordShape(**await self.handle.record_shape.remote())
            except Exception:  # noqa: BLE001 - no replica answers: the fixed keys only
                return RecordShape()
        return self.shape

    async def score(self, request: dict[str, Any]) -> dict[str, Any]:
        """At most ``max_in_flight`` requests of this caller are in Serve at once; the others wait here for room
        (back-pressure, as the in-process reward does), since Serve's per-caller bound is soft under a burst."""
        loop = asyncio.get_running_loop()
        room = self._room.setdefault(loop, asyncio.Semaphore(self.max_in_flight))
        async with room:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                return await self._score(request)
            finally:
                self.in_flight -= 1

    async def _score(self, request: dict[str, Any]) -> dict[str, Any]:
        deadline, lost = time.monotonic() + self.timeout_s, 0
        while True:
            try:
                result = await self.handle.score.remote(request)
                self.counts["answered"] += 1
                return result
            except BackPressureError as exc:
                self.counts["refused"] += 1
                self.last_refusal, self.most_queued = str(exc), max(self.most_queued, exc.args[0])
                if time.monotonic() > deadline:
                    why = f"every queue stayed full for serve_timeout_s={self.timeout_s}: {exc}"
                    return await self._unavailable(why)
                await asyncio.sleep(self.backoff_s)
            except REPLICA_LOST as exc:
                lost += 1
                if lost > self.retries:
                    return await self._unavailable(
                        f"replica lost {lost} times (serve_retries={self.retries}); last: {type(exc).__name__}: "
                        f"{str(exc)[:300]}"
                    )
                self.counts["resent"] += 1
                await asyncio.sleep(self.backoff_s * 2 ** (lost - 1))
            except Exception as exc:  # noqa: BLE001 - the scorer raised on this response alone (a bug): name it
                self.counts["scoring_error"] += 1
                logger.warning("the Serve reward raised on one response: %s", exc)
                return unscored_record(await self._shape(), "scoring_error", f"{type(exc).__name__}: {str(exc)[:500]}")

    async def _unavailable(self, detail: str) -> dict[str, Any]:
        self.counts["unavailable"] += 1
        logger.warning("reward_unavailable: %s", detail)
        return unscored_record(await self._shape(), "reward_unavailable", detail)


_clients: dict[str, ServeRewardClient] = {}
_clients_lock = threading.Lock()


def existing_client(app: str) -> ServeRewardClient | None:
    """This process's client of the application ``app`` once `client_for` made it (no lock, no Ray call)."""
    return _clients.get(app)


def client_for(model: ModelSettings, batch: BatchSettings, settings: ServeSettings) -> ServeRewardClient:
    """This process's client of ``settings.serve_app``, deploying the application first when ``model`` names the
    models (codec and asr) and it does not run yet; without them, the application must be running."""
    app = settings.serve_app
    with _clients_lock:
        if app not in _clients:
            if not ray.is_initialized():
                raise SettingsError(
                    f"reward_kwargs.serve_app={app!r} needs a Ray cluster: call from veRL's reward loop (a Ray "
                    "actor), or use server_url for a reward reached over HTTP"
                )
            deploy = bool(model.codec and model.asr)
            if deploy:
                ensure_app(model, batch, settings)
            elif app_status(app) is None:
                raise SettingsError(
                    f"reward_kwargs.serve_app={app!r}: no such Serve application runs in this Ray cluster; start it "
                    "(maspo-verl reward-serve --address ...) or give codec and asr so the reward deploys it"
                )
            _clients[app] = ServeRewardClient(
                app,
                shape=RecordShape.from_settings(model) if deploy else None,
                retries=settings.serve_retries,
                timeout_s=settings.serve_timeout_s,
                max_in_flight=batch.max_queue,
            )
        return _clients[app]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="maspo-verl reward-serve", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--address",
        default=None,
        help="Ray cluster to join (auto, or HOST:PORT of its head); default: start a Ray instance on this node",
    )
    add_arguments(p, ModelSettings, required=("codec", "asr"))
    add_arguments(p, BatchSettings)
    add_arguments(p, ServerSettings)
    add_arguments(p, ServeSettings)
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        model, batch, server, settings = (
            parse_arguments(args, cls, "reward-serve")
            for cls in (ModelSettings, BatchSettings, ServerSettings, ServeSettings)
        )
    except SettingsError as exc:
        print(f"reward-serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=server.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = settings.serve_app or DEFAULT_APP
    ray.init(address=args.address, include_dashboard=False, logging_level=server.log_level.upper())
    signal.signal(signal.SIGTERM, _interrupt)  # stop as on Ctrl-C: the application goes, the cluster stays clean
    try:
        serve.start(http_options={"host": server.host, "port": server.port})
        serve.run(build_app(model, batch, settings, server), name=app, route_prefix="/", logging_config=QUIET)
        print(f"reward-serve: application {app!r} on http://{server.host}:{server.port}", flush=True)
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        if args.address is None:
            serve.shutdown()
        else:
            serve.delete(app)  # the cluster's Serve stays for its other applications
        ray.shutdown()
    return 0


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
