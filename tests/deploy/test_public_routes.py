"""Every route the edge serves is either public (the ALB forwards it: iac/modules/alb `public_paths`)
or an operator route the ALB must never forward. A new route fails here until someone decides
which it is, so an operator endpoint cannot become public by being added."""

from __future__ import annotations

import re

from edge.app import create_app
from edge.config import load_settings
from tests.iac.hcl import MODULES, module

PUBLIC_PATTERNS: list[str] = module(MODULES / "alb").variables()["public_paths"]["default"]
# Reachable only from inside the VPC (the edge's ops listener, or the admin key).
OPERATOR = {"/metrics", "/readyz", "/v1/internal/engine", "/schema", "/schema/openapi.json"}
OPERATOR_PREFIXES = ("/v1/admin/",)


def forwarded(path: str) -> bool:
    """ALB path-pattern matching: `*` any characters, `?` one, case-sensitive, whole path."""
    return any(
        re.fullmatch(re.escape(p).replace(r"\*", ".*").replace(r"\?", "."), path) for p in PUBLIC_PATTERNS
    )


def edge_paths() -> set[str]:
    # With an admin key: without one the admin API is not mounted at all.
    app = create_app(load_settings(overrides={"keys": {"admin_key_sha256": "ab" * 32}}))
    return {re.sub(r"\{[^}]+\}", "x", route.path) for route in app.routes}


def test_every_edge_route_is_public_or_operator_and_only_public_ones_are_forwarded() -> None:
    paths = edge_paths()
    operator = {p for p in paths if p in OPERATOR or p.startswith(OPERATOR_PREFIXES)}
    public = paths - operator

    assert {"/v1/chat/completions", "/v1/models", "/healthz"} <= public
    assert "/v1/admin/keys" in operator and "/metrics" in operator
    for path in public:
        assert forwarded(path), (
            f"{path}: served by the edge, not forwarded by the ALB (add it to public_paths?)"
        )
    for path in operator:
        assert not forwarded(path), f"{path}: an operator route the ALB forwards"
