# API keys and per-user usage, as edge/keys/dynamodb.py and edge/usage/dynamodb.py write them: one
# table, partition key pk, sort key sk. A key is (key#<sha256>, key), looked up by the hash of the
# presented key; a usage row is (usage#<user>, <day>#<model>), its counters added to atomically.
# The key listing (admin API, `floodgate keys list`) reads a page of keys by id off one of two sparse
# indexes (only key items carry both attributes): keys_by_owner (one user's), keys_by_kind (everyone's).
# No key is ever stored, only its SHA-256. On-demand billing: lookups follow traffic, and each edge
# caches them for keys.cache_ttl_s.

resource "aws_dynamodb_table" "keys" {
  name                        = var.name
  billing_mode                = "PAY_PER_REQUEST"
  hash_key                    = "pk"
  range_key                   = "sk"
  deletion_protection_enabled = true

  attribute {
    name = "pk"
    type = "S"
  }

  attribute {
    name = "sk"
    type = "S"
  }

  attribute {
    name = "owner"
    type = "S"
  }

  attribute {
    name = "kind"
    type = "S"
  }

  attribute {
    name = "id"
    type = "S"
  }

  # DynamoDB builds an index added to a stored table from its items: keys stored before are listed.
  global_secondary_index {
    name            = "keys_by_owner"
    hash_key        = "owner"
    range_key       = "id"
    projection_type = "ALL"
  }

  global_secondary_index {
    name            = "keys_by_kind"
    hash_key        = "kind"
    range_key       = "id"
    projection_type = "ALL"
  }

  point_in_time_recovery {
    enabled = true
  }

  server_side_encryption {
    enabled     = true
    kms_key_arn = var.kms_key_arn
  }
}

# What the edge calls on the table: GetItem (authenticate), PutItem (create, revoke, rotate,
# set-tier, import: the admin API and the start-up import of keys_file), UpdateItem (usage rows),
# Query and Scan (usage reports; a page of keys queries an index; a rotation's chain scans).
data "aws_iam_policy_document" "edge" {
  statement {
    sid       = "KeysTable"
    actions   = ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Query", "dynamodb:Scan"]
    resources = [aws_dynamodb_table.keys.arn]
  }

  statement {
    sid       = "KeysTableListing"
    actions   = ["dynamodb:Query"]
    resources = ["${aws_dynamodb_table.keys.arn}/index/keys_by_owner", "${aws_dynamodb_table.keys.arn}/index/keys_by_kind"]
  }

  statement {
    sid       = "KeysTableKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [var.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["dynamodb.${data.aws_region.current.name}.amazonaws.com"]
    }
  }
}

data "aws_region" "current" {}

resource "aws_iam_role_policy" "edge" {
  name   = "keys-table"
  role   = element(split("/", var.edge_task_role_arn), length(split("/", var.edge_task_role_arn)) - 1)
  policy = data.aws_iam_policy_document.edge.json
}
