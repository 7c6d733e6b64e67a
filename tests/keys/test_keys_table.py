"""The Terraform keys table is the one the stores expect, and the edge may make exactly their calls."""

from __future__ import annotations

import re
from pathlib import Path

from edge.keys import dynamodb
from tests.iac.hcl import EXAMPLE, MODULES, module, only, resolve

REPO = Path(__file__).resolve().parents[2]


def test_the_keys_table_matches_the_store() -> None:
    table = module(MODULES / "keys_table").resource("aws_dynamodb_table", "keys")
    assert table["billing_mode"] == "PAY_PER_REQUEST"
    assert (table["hash_key"], table["range_key"]) == (dynamodb.PARTITION_KEY, dynamodb.SORT_KEY)
    assert only(table["point_in_time_recovery"])["enabled"] is True
    assert only(table["server_side_encryption"]) == {"enabled": True, "kms_key_arn": "${var.kms_key_arn}"}


def test_the_edge_may_make_exactly_the_calls_the_stores_make() -> None:
    documents = module(MODULES / "keys_table").data("aws_iam_policy_document")
    statements = {s["sid"]: s for s in documents["edge"]["statement"]}
    allowed = {a.removeprefix("dynamodb:") for a in statements["KeysTable"]["actions"]}
    sources = "".join(
        (REPO / "edge" / part).read_text() for part in ("keys/dynamodb.py", "usage/dynamodb.py")
    )
    called = {
        "".join(w.title() for w in name.split("_")) for name in re.findall(r"self\._client\.(\w+)\(", sources)
    } - {"Close"}
    assert allowed == called
    assert statements["KeysTable"]["resources"] == ["${aws_dynamodb_table.keys.arn}"]


def test_the_example_wires_the_table_into_the_edges_settings() -> None:
    env = module(EXAMPLE)
    assert env.calls()["keys"]["edge_task_role_arn"] == "${module.edge.task_role_arn}"
    args = resolve(env.calls()["edge"]["config_toml"], env, "edge")
    assert re.search(r"\bkeys_table\s*=\s*module\.keys\.name", args)
    template = (EXAMPLE / "edge.toml.tftpl").read_text()
    assert 'dynamodb_table = "${keys_table}"' in template
