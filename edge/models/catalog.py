"""Which model's pipeline serves a request: the request's `model`, seen through the key's tier.

A model the tier may not use answers exactly as one that does not exist (404 model_not_found, the
same body), so a key cannot learn which models other tiers have.
"""

from __future__ import annotations

from collections.abc import Iterator

from edge.admission.dispatcher import Dispatcher
from edge.admission.replica_set import ReplicaState
from edge.config import TierConfig
from edge.models.served import tier_models
from edge.pipeline import Pipeline
from edge.schemas import unknown_model


class ModelCatalog:
    def __init__(self, pipelines: dict[str, Pipeline], tiers: dict[str, TierConfig], several: bool) -> None:
        """`pipelines` in the configured order; `several`: from [models.*] (tiers' lists apply)."""
        self._pipelines = pipelines
        names = list(pipelines)
        self._by_tier = {tier: tier_models(config, names, several) for tier, config in tiers.items()}
        self.default = next(iter(pipelines.values()))

    def models_for(self, tier: str) -> list[str]:
        """What the tier may use, its default first; nothing for a tier that is not configured."""
        return list(self._by_tier.get(tier, ()))

    def pipeline_for(self, tier: str, model: str) -> Pipeline:
        """An empty `model` is the tier's default. An unconfigured tier gets the default pipeline,
        whose admit answers 403 unknown_tier before looking at the model."""
        allowed = self._by_tier.get(tier)
        if allowed is None:
            return self.default
        if not model:
            return self._pipelines[allowed[0]]
        if model not in allowed:
            raise unknown_model(model)
        return self._pipelines[model]

    def max_model_len(self, model: str) -> int:
        """The model's context: prompt and completion together, in tokens."""
        return self._pipelines[model].max_model_len

    def pipelines(self) -> Iterator[tuple[str, Pipeline]]:
        return iter(self._pipelines.items())

    def dispatchers(self) -> Iterator[Dispatcher]:
        return (p.dispatcher for p in self._pipelines.values())

    def replica_states(self) -> list[ReplicaState]:
        """Every model's replicas (each model's dispatcher sees only its own)."""
        return [state for d in self.dispatchers() for state in d.replica_states()]
