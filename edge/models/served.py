"""The models an app serves, read from the settings: `[models.NAME]` tables, or `[model]` alone."""

from __future__ import annotations

from dataclasses import dataclass

from msgspec.structs import replace

from edge.config import ModelConfig, ServedModelConfig, Settings, TierConfig


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One model and the settings its replicas are built from.

    `settings` is the app's settings as this model sees them: `model` names its checkpoint,
    `engine.replicas` its engine count, `upstream.triton` its replicas, `metrics` its replicas'
    prices (its scaling demand); everything else is shared.
    """

    name: str
    settings: Settings
    triton_model: str = ""  # empty: tensorrt_llm

    @property
    def model(self) -> ModelConfig:
        return self.settings.model


def served_models(settings: Settings) -> list[ServedModel]:
    """In the order configured: the first is the default where a tier names none."""
    if not settings.models:
        return [ServedModel(settings.model.name, settings)]
    return [_served(settings, name, spec) for name, spec in settings.models.items()]


def _served(settings: Settings, name: str, spec: ServedModelConfig) -> ServedModel:
    model = replace(
        settings.model,
        source=spec.source,
        path=spec.path,
        name=name,
        token_weight=spec.token_weight,
        default_temperature=spec.default_temperature,
        default_top_p=spec.default_top_p,
        max_model_len=spec.max_model_len,
    )
    engine = settings.engine if spec.replicas is None else replace(settings.engine, replicas=spec.replicas)
    upstream = settings.upstream if spec.triton is None else replace(settings.upstream, triton=spec.triton)
    metrics = replace(
        settings.metrics,
        prefill_s_per_token=_given(spec.prefill_s_per_token, settings.metrics.prefill_s_per_token),
        decode_s_per_token=_given(spec.decode_s_per_token, settings.metrics.decode_s_per_token),
    )
    own = replace(settings, model=model, engine=engine, upstream=upstream, metrics=metrics)
    return ServedModel(name, own, spec.triton_model)


def _given(own: float | None, shared: float) -> float:
    return shared if own is None else own


def tier_models(tier: TierConfig, served: list[str], several: bool) -> list[str]:
    """The models a tier may use, its default first. With one model ([model] alone) every tier
    uses it, whatever its `models` say."""
    allowed = [m for m in served if not several or not tier.models or m in tier.models]
    default = tier.default_model if several and tier.default_model in allowed else allowed[0]
    return [default, *(m for m in allowed if m != default)]


def default_model(settings: Settings, tier: str) -> str:
    """The model a key of `tier` gets when its request names none (the first model when the tier
    is not configured)."""
    names = [m.name for m in served_models(settings)]
    config = settings.tiers.get(tier)
    return names[0] if config is None else tier_models(config, names, bool(settings.models))[0]
